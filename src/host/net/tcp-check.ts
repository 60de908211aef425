import { HostOpError, HostOps } from '../hostops.js';

/**
 * Does HOST:PORT accept a TCP connection, as seen from inside the network namespace at
 * `netnsPath`? The helper joins the namespace on one thread for the attempt, so the check needs
 * nothing inside the machine's image.
 */
export async function tcpAccepts(
  netnsPath: string,
  host: string,
  port: number,
  timeoutMs: number,
): Promise<{ ok: boolean; error?: string }> {
  try {
    await HostOps.require().request('tcp-check', netnsPath, host, String(port), String(timeoutMs));
    return { ok: true };
  } catch (e) {
    if (e instanceof HostOpError) return { ok: false, error: e.message };
    throw e;
  }
}
