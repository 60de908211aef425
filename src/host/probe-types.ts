/** Result of asking whether a driver, backend or host facility works here (principle 3). */
export interface Availability {
  ok: boolean;
  /** what was found, or why it does not work */
  reason: string;
  /** the exact command or step that fixes it, when not ok */
  fix?: string;
}
