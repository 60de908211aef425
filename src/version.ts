/** snaplab's version: the CLI's --version, the daemon's /healthz and its OpenAPI document. */
export const VERSION = '0.1.0';
