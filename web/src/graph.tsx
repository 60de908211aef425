/**
 * A scenario drawn as a network diagram (SVG): the networks as bridges in a row across the middle,
 * the machines in a row above and a row below, a line from each machine to each network it is on,
 * and every blocked pair as a red dashed line marked ✕.
 *
 * The layout is a pure function of the status (no randomness, no measuring), so the same scenario
 * is always drawn the same way and a block/unblock moves nothing but the red lines.
 *
 * Preact 11 no longer turns camelCase SVG props into attributes (strokeWidth stays strokeWidth),
 * so the presentation attributes below are written hyphenated.
 */
import { href } from './hooks';

export type { MachineStatus, ScenarioStatus } from '../../src/views';
import type { MachineStatus, ScenarioStatus } from '../../src/views';

// geometry, in viewBox units
const PAD = 16;
const NODE_W = 140;
const NODE_GAP = 20; // least horizontal space between two machines of a row
const LINE = 14; // one address line
const BRIDGE_H = 42;
const V_GAP = 56; // between a machine row and the bridges
const ARC = 52; // room above the top row and below the bottom row for blocked arcs

/** Networks: dark enough for text on white (≥ 4.5:1), and not the red/green used for states and blocks. */
const NET_COLOURS = ['#1f5fbf', '#6b3fa0', '#0b6a6a', '#4d5663'];

/** Border and text colour, fill, by state (the same families as the .state-* classes). */
function stateColours(state: string): [string, string] {
  if (state === 'running') return ['#1d6b2f', '#eaf5ec'];
  if (state === 'paused' || state === 'creating' || state === 'making') return ['#8a5a00', '#fdf3e1'];
  return ['#b3261e', '#fdecea'];
}

const clip = (s: string, n: number): string => (s.length > n ? `${s.slice(0, n - 1)}…` : s);
const nodeH = (m: MachineStatus): number => 40 + LINE * Math.max(1, m.addresses.length);

interface Placed {
  m: MachineStatus;
  x: number; // centre
  top: number;
  bottom: number;
  row: 0 | 1; // 0 above the bridges, 1 below
}

interface Layout {
  width: number;
  height: number;
  mid: number;
  bridgeW: number;
  netX: Map<string, number>;
  nodes: Map<string, Placed>;
}

/** Push the machines of one row apart so none overlap, keeping each as near its wish as it can. */
function spread(wish: number[], lo: number, hi: number): number[] {
  const step = NODE_W + NODE_GAP;
  const x = wish.map((w) => Math.min(hi, Math.max(lo, w)));
  for (let i = 1; i < x.length; i++) x[i] = Math.max(x[i]!, x[i - 1]! + step);
  // what ran off the right edge comes back leftwards (the width leaves room for the whole row)
  if (x.length) x[x.length - 1] = Math.min(x[x.length - 1]!, hi);
  for (let i = x.length - 2; i >= 0; i--) x[i] = Math.min(x[i]!, x[i + 1]! - step);
  return x;
}

export function layout(s: ScenarioStatus): Layout {
  const nNets = Math.max(1, s.networks.length);
  const perRow = Math.ceil(s.machines.length / 2);
  const width = Math.max(600, nNets * 250, perRow * (NODE_W + NODE_GAP) + 2 * PAD);
  const colW = (width - 2 * PAD) / nNets;
  const netX = new Map(s.networks.map((n, i) => [n.name, PAD + (i + 0.5) * colW]));
  const bridgeW = Math.max(150, Math.min(240, colW - 30));

  // Each machine wants to sit over the middle of its networks (a router between two sits between
  // them). Sorted by that wish (ties keep the file's order) and dealt alternately to the top and
  // bottom rows, so two machines of one network face each other across its bridge.
  const wish = (m: MachineStatus): number => {
    const xs = m.addresses.map((a) => netX.get(a.network)).filter((x): x is number => x !== undefined);
    return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : width / 2;
  };
  const order = s.machines.map((m, i) => ({ m, i, w: wish(m) })).sort((a, b) => a.w - b.w || a.i - b.i);
  const rows: (typeof order)[] = [order.filter((_, k) => k % 2 === 0), order.filter((_, k) => k % 2 === 1)];

  const maxH = Math.max(40 + LINE, ...s.machines.map(nodeH));
  const topBottom = PAD + ARC + maxH; // the top row hangs from this line (its lower edges on it)
  const mid = topBottom + V_GAP + BRIDGE_H / 2;
  const bottomTop = mid + BRIDGE_H / 2 + V_GAP; // the bottom row stands on this line
  // (one machine: no bottom row, so no room kept for it)
  const height = rows[1]!.length ? bottomTop + maxH + ARC + PAD : mid + BRIDGE_H / 2 + PAD;

  const nodes = new Map<string, Placed>();
  rows.forEach((row, r) => {
    const xs = spread(
      row.map((o) => o.w),
      PAD + NODE_W / 2,
      width - PAD - NODE_W / 2,
    );
    row.forEach((o, k) => {
      const h = nodeH(o.m);
      const top = r === 0 ? topBottom - h : bottomTop;
      nodes.set(o.m.machine, { m: o.m, x: xs[k]!, top, bottom: top + h, row: r as 0 | 1 });
    });
  });
  return { width, height, mid, bridgeW, netX, nodes };
}

/** The drawing of a blocked pair: a path and where its ✕ goes. */
function blockedPath(a: Placed, b: Placed): { d: string; lx: number; ly: number } {
  if (a.row === b.row) {
    // same row: an arc outwards (over the top row, under the bottom one), higher the wider it is,
    // so it passes over the machines between the two instead of through them
    const up = a.row === 0;
    const ya = up ? a.top : a.bottom;
    const yb = up ? b.top : b.bottom;
    const lift = Math.min(24 + Math.abs(a.x - b.x) * 0.12, 2 * (ARC - 12));
    const cx = (a.x + b.x) / 2;
    const cy = up ? Math.min(ya, yb) - lift : Math.max(ya, yb) + lift;
    // the point of a quadratic curve at t = 1/2
    return { d: `M${a.x},${ya} Q${cx},${cy} ${b.x},${yb}`, lx: (a.x + 2 * cx + b.x) / 4, ly: (ya + 2 * cy + yb) / 4 };
  }
  // across: a straight line from the top machine's lower edge to the bottom machine's upper edge;
  // its ✕ a quarter of the way down, in the gap above the bridges rather than on one
  const [t, u] = a.row === 0 ? [a, b] : [b, a];
  const k = 0.25;
  return {
    d: `M${t.x},${t.bottom} L${u.x},${u.top}`,
    lx: t.x + (u.x - t.x) * k,
    ly: t.bottom + (u.top - t.bottom) * k,
  };
}

type Blocked = { a: string; b: string; d: string; lx: number; ly: number };

export function ScenarioGraph({ status }: { status: ScenarioStatus }) {
  const L = layout(status);
  const colour = new Map(status.networks.map((n, i) => [n.name, NET_COLOURS[i % NET_COLOURS.length]!]));
  const placed = [...L.nodes.values()];
  const drawn: Blocked[] = status.blocked.flatMap(([x, y]) => {
    const [a, b] = [x, y].sort() as [string, string];
    const pa = L.nodes.get(a);
    const pb = L.nodes.get(b);
    return pa && pb && a !== b ? [{ a, b, ...blockedPath(pa, pb) }] : [];
  });
  // The svg is 100% of the card wide, but never blown up past 1.25× nor shrunk below 0.8× (the
  // wrapper scrolls sideways on a narrow window, so the labels stay readable).
  return (
    <div class="table-wrap">
      {/* biome-ignore lint/a11y/useSemanticElements: an SVG drawing, where no HTML element can stand; a group because its machines are links */}
      <svg
        data-testid="scenario-graph"
        viewBox={`0 0 ${L.width} ${L.height}`}
        role="group"
        aria-label={`network graph of scenario ${status.name}: ${status.machines.length} machines, ${status.networks.length} networks, ${status.blocked.length} blocked pairs`}
        style={{
          display: 'block',
          width: '100%',
          height: 'auto',
          maxWidth: `${L.width * 1.25}px`,
          minWidth: `${Math.round(L.width * 0.8)}px`,
          margin: '0 auto',
        }}
        font-family="system-ui, sans-serif"
      >
        <title>{`scenario ${status.name}`}</title>
        <Links L={L} placed={placed} colour={colour} />
        <BlockedPaths drawn={drawn} />
        <Bridges L={L} status={status} colour={colour} />
        <Machines placed={placed} colour={colour} />
        <BlockedMarks drawn={drawn} />
      </svg>
    </div>
  );
}

/** Links: machine to each of its networks, ending on the bridge right below/above it when it can. */
function Links({ L, placed, colour }: { L: Layout; placed: Placed[]; colour: Map<string, string> }) {
  return (
    <>
      {placed.flatMap((p) =>
        p.m.addresses.map((a) => {
          const bx = L.netX.get(a.network);
          if (bx === undefined) return null;
          const half = L.bridgeW / 2 - 12;
          const ex = Math.min(bx + half, Math.max(bx - half, p.x));
          const y1 = p.row === 0 ? p.bottom : p.top;
          const y2 = p.row === 0 ? L.mid - BRIDGE_H / 2 : L.mid + BRIDGE_H / 2;
          return (
            <line
              data-link={`${p.m.machine}|${a.network}`}
              x1={p.x}
              y1={y1}
              x2={ex}
              y2={y2}
              stroke={colour.get(a.network)}
              stroke-width={2}
            />
          );
        }),
      )}
    </>
  );
}

/** Blocked pairs: under the bridges and machines (their labels stay readable), over the links. */
function BlockedPaths({ drawn }: { drawn: Blocked[] }) {
  return (
    <>
      {drawn.map(({ a, b, d }) => (
        <path data-blocked={`${a}|${b}`} d={d} fill="none" stroke="#b3261e" stroke-width={2.5} stroke-dasharray="7 5">
          <title>{`${a} and ${b} blocked: traffic between them is dropped`}</title>
        </path>
      ))}
    </>
  );
}

function Bridges({ L, status, colour }: { L: Layout; status: ScenarioStatus; colour: Map<string, string> }) {
  return (
    <>
      {status.networks.map((n) => {
        const x = L.netX.get(n.name)!;
        const c = colour.get(n.name)!;
        return (
          <g data-network={n.name}>
            <title>{`network ${n.name} ${n.subnet}`}</title>
            <rect
              x={x - L.bridgeW / 2}
              y={L.mid - BRIDGE_H / 2}
              width={L.bridgeW}
              height={BRIDGE_H}
              rx={BRIDGE_H / 2}
              fill="#fff"
              stroke={c}
              stroke-width={3}
            />
            <text x={x} y={L.mid - 3} text-anchor="middle" font-size={13} font-weight={700} fill={c}>
              {clip(n.name, 24)}
            </text>
            <text
              x={x}
              y={L.mid + 13}
              text-anchor="middle"
              font-size={11}
              fill="#4d5663"
              font-family="ui-monospace, monospace"
            >
              {n.subnet}
            </text>
          </g>
        );
      })}
    </>
  );
}

/** Machines: a click opens the machine's page (keyboard users have the table's links). */
function Machines({ placed, colour }: { placed: Placed[]; colour: Map<string, string> }) {
  return (
    <>
      {placed.map((p) => {
        const [fg, bg] = stateColours(p.m.state);
        const left = p.x - NODE_W / 2;
        return (
          <a href={href('machines', p.m.sandbox)} tabindex={-1}>
            <g data-machine={p.m.machine} data-state={p.m.state}>
              <title>{`${p.m.machine} (${p.m.sandbox}) ${p.m.state}${p.m.reason ? `: ${p.m.reason}` : ''}\n${p.m.addresses.map((a) => `${a.network} ${a.address}`).join('\n')}`}</title>
              <rect
                x={left}
                y={p.top}
                width={NODE_W}
                height={p.bottom - p.top}
                rx={6}
                fill={bg}
                stroke={fg}
                stroke-width={2}
              />
              <text x={left + 10} y={p.top + 18} font-size={13} font-weight={700} fill="#1b1f24">
                {clip(p.m.machine, 17)}
              </text>
              <text x={left + 10} y={p.top + 33} font-size={11} fill={fg}>
                {p.m.state}
              </text>
              {p.m.addresses.map((a, k) => (
                <text
                  x={left + 10}
                  y={p.top + 50 + k * LINE}
                  font-size={10.5}
                  font-family="ui-monospace, monospace"
                  fill={colour.get(a.network) ?? '#4d5663'}
                >
                  {/* the network's name too, not only its colour */}
                  {`${clip(a.network, Math.max(3, 19 - a.address.length))} ${a.address}`}
                </text>
              ))}
            </g>
          </a>
        );
      })}
    </>
  );
}

/** The ✕ of each blocked pair, over everything. */
function BlockedMarks({ drawn }: { drawn: Blocked[] }) {
  return (
    <>
      {drawn.map(({ a, b, lx, ly }) => (
        <g data-blocked-mark={`${a}|${b}`}>
          <title>{`${a} and ${b} blocked: traffic between them is dropped`}</title>
          <circle cx={lx} cy={ly} r={9} fill="#fff" stroke="#b3261e" stroke-width={2} />
          <text x={lx} y={ly + 4.5} text-anchor="middle" font-size={13} font-weight={700} fill="#b3261e">
            ✕
          </text>
        </g>
      ))}
    </>
  );
}
