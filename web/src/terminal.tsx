/**
 * A terminal in the page: xterm.js over the streamed-exec WebSocket with a PTY. Loaded only when
 * a terminal is opened (xterm is most of the dashboard's JavaScript). The window's size follows
 * the element (fit addon + ResizeObserver) and is sent as `resize`; keys go as binary stdin.
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import { enc, streamUrl } from './api';

// the machine's login shell: bash where it has one, else sh (as `snaplab shell` picks)
const SHELL = ['/bin/sh', '-c', 'for s in /bin/bash /bin/sh; do [ -x "$s" ] && exec "$s" -l; done'];

export default function TerminalView({ id }: { id: string }) {
  const el = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState('connecting…');
  const [gen, setGen] = useState(0);
  useEffect(() => {
    const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(el.current!);
    fit.fit();
    const ws = new WebSocket(streamUrl(`/sandboxes/${enc(id)}/exec`, true));
    ws.binaryType = 'arraybuffer';
    const send = (m: unknown): void => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(m));
    };
    ws.onopen = () => {
      // the shell ends with its page (closed, another tab, New session): none is left behind
      send({
        type: 'start',
        argv: SHELL,
        tty: { cols: term.cols, rows: term.rows },
        stdin: true,
        env: ['TERM=xterm-256color', 'HOME=/root'],
        cwd: '/root',
        timeoutMs: 0,
        onDisconnect: 'kill',
      });
      term.focus();
    };
    ws.onmessage = (m: MessageEvent<ArrayBuffer | string>) => {
      if (typeof m.data !== 'string') {
        term.write(new Uint8Array(m.data, 1)); // the first byte says stdout or stderr: one screen shows both
        return;
      }
      const msg = JSON.parse(m.data) as {
        type: string;
        result?: { exitCode: number | null };
        error?: { message?: string } | string;
        from?: number;
        to?: number;
      };
      if (msg.type === 'started') setStatus('connected');
      else if (msg.type === 'exit') setStatus(`exited (${msg.result?.exitCode ?? 'signal'})`);
      else if (msg.type === 'gap') term.write(`\r\n[output ${msg.from}–${msg.to} lost]\r\n`);
      else if (msg.type === 'error')
        setStatus(`error: ${typeof msg.error === 'string' ? msg.error : (msg.error?.message ?? 'refused')}`);
    };
    ws.onclose = (e) =>
      setStatus((s) =>
        s.startsWith('exited') || s.startsWith('error') ? s : `closed (${e.code}${e.reason ? `: ${e.reason}` : ''})`,
      );
    const data = term.onData((d) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(new TextEncoder().encode(d));
    });
    const binary = term.onBinary((d) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(Uint8Array.from(d, (c) => c.charCodeAt(0)));
    });
    const resized = term.onResize(({ cols, rows }) => send({ type: 'resize', cols, rows }));
    const obs = new ResizeObserver(() => fit.fit());
    obs.observe(el.current!);
    return () => {
      obs.disconnect();
      data.dispose();
      binary.dispose();
      resized.dispose();
      ws.close();
      term.dispose();
    };
  }, [id, gen]);
  return (
    <div>
      <div class="row">
        <span class="muted" data-testid="terminal-status">
          {status}
        </span>
        <button type="button" onClick={() => setGen((g) => g + 1)}>
          New session
        </button>
      </div>
      <div class="terminal" ref={el} data-testid="terminal" />
    </div>
  );
}
