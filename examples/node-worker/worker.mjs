// A Koala worker in plain Node.js (20+): global fetch, no dependencies, no SDK.
// It speaks the calls of docs/worker-api.md: register, acquire (long-poll), heartbeat,
// complete, fail and stop; and handles the four 409 reasons each by name. On SIGTERM it calls
// stop, which answers its open acquire at once (nothing more is handed out), lets running bodies
// finish until the deadline, and calls stop again, which records its exit.
//
//   KOALA_URL=http://127.0.0.1:8000 KOALA_API_KEY=kk_... KOALA_KINDS=http.echo@1 node worker.mjs
//
// Each kind served must be one Koala knows (declared on the server with remote_kind, in a module
// listed in KOALA_JOB_KIND_MODULES): the default, http.echo@1, is declared in workers/builtin_kinds.py.
//
// The body: output {"echo": input}. If the input has a number "delay_ms", the body first waits
// that long (heartbeating meanwhile), so a long step, a cancel or a shutdown can be watched.
// KOALA_NO_BODY=name@version,... : kinds registered (declared) but with no body in this process
// (a deploy where the declaration runs ahead of the code): their leases are failed "unservable".
//
// KOALA_WORKFLOWS=name@version,... : workflows whose steps it serves (each declared on the server
// with workers.workflow and remote_step). It registers {name, version, steps} for the steps it has
// bodies for (STEP_BODIES); a lease of a step carries "step", "steps" (the earlier steps' outputs
// by name), "state" (the run's state) and "run"; the body returns the step's output and a state
// delta, which complete sends as "state_delta" (merged into the run's state by top-level key).
// http_hello@1 (workers/builtin_kinds.py): "greet" then "shout".

import os from "node:os";

const BASE = (process.env.KOALA_URL || "http://127.0.0.1:8000").replace(/\/+$/, "");
const KEY = process.env.KOALA_API_KEY || "";
const KINDS = (process.env.KOALA_KINDS || "http.echo@1").split(",").map((s) => s.trim()).filter(Boolean).map((spec) => {
  const [name, version] = spec.split("@");
  return { name, version: Number(version || 1), steps: [] };
});
const CONCURRENCY = Number(process.env.KOALA_CONCURRENCY || 4);
const NAME = process.env.KOALA_WORKER_NAME || undefined;
const SHUTDOWN_DEADLINE_MS = Number(process.env.KOALA_SHUTDOWN_DEADLINE_SECONDS || 10) * 1000;
const serves = new Set(KINDS.map((k) => `${k.name}@${k.version}`));
const NO_BODY = new Set((process.env.KOALA_NO_BODY || "").split(",").map((s) => s.trim()).filter(Boolean)
  .map((spec) => (spec.includes("@") ? spec : `${spec}@1`)));
// The body table: what this process can actually run, by kind@version.
const BODIES = new Map([...serves].filter((k) => !NO_BODY.has(k)).map((k) => [k, echoBody]));

// Step bodies, by workflow and step: (input, signal, lease) -> {output, state}.
const STEP_BODIES = {
  http_hello: {
    greet: async (input) => ({ output: { greeting: `Hello, ${input.name}!` }, state: { greeted: input.name } }),
    shout: async (input, signal, lease) => ({
      output: { shout: String(lease.steps.greet?.greeting || "").toUpperCase(), greeted: lease.state.greeted },
      state: { shouted: true },
    }),
  },
};
const WORKFLOWS = (process.env.KOALA_WORKFLOWS || "").split(",").map((s) => s.trim()).filter(Boolean).map((spec) => {
  const [name, version] = spec.split("@");
  return { name, version: Number(version || 1), steps: Object.keys(STEP_BODIES[name] || {}) };
});
const flows = new Set(WORKFLOWS.map((w) => `${w.name}@${w.version}`));

// The body of a lease: a workflow's step (its kind is "<workflow>.<step>") or a kind's.
function bodyFor(lease) {
  if (lease.step) {
    const workflow = lease.kind.slice(0, -(lease.step.length + 1));
    const step = flows.has(`${workflow}@${lease.version}`) ? STEP_BODIES[workflow]?.[lease.step] : undefined;
    return step;
  }
  const kind = BODIES.get(`${lease.kind}@${lease.version}`);
  return kind && (async (input, signal) => ({ output: await kind(input, signal) }));
}

const log = (...args) => console.log(new Date().toISOString(), "koala-node:", ...args);
const sleep = (ms, signal) => new Promise((resolve) => {
  const timer = setTimeout(resolve, ms);
  signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
});
// Exponential backoff with jitter, capped at 10 s (a server restart, a network blip).
const backoff = (failures) => { const step = Math.min(10_000, 200 * 2 ** Math.min(failures - 1, 16)); return step / 2 + Math.random() * step / 2; };

class ApiError extends Error {
  constructor(status, code, message, retryAfter) { super(`${status} ${code}: ${message}`); Object.assign(this, { status, code, retryAfter }); }
  get transient() { return this.status === 0 || this.status >= 500 || this.status === 429; }
}
const REASONS = new Set(["lease_expired", "lease_superseded", "job_cancelled", "already_recorded"]);
class Rejected extends Error {
  constructor(reason, message) { super(`${reason}: ${message}`); this.reason = reason; }
}

async function call(path, body, { signal, timeoutMs = 30_000 } = {}) {
  const timeout = AbortSignal.timeout(timeoutMs);
  let answer;
  try {
    answer = await fetch(BASE + path, {
      method: "POST",
      headers: { Authorization: `Bearer ${KEY}`, "Content-Type": "application/json", "User-Agent": "koala-node-example/0.1" },
      body: JSON.stringify(body),
      signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
    });
  } catch (err) {
    throw new ApiError(0, "unavailable", String(err?.cause?.code || err?.name || err));
  }
  if (answer.status === 204) return null;
  const text = await answer.text();
  let parsed = null;
  try { parsed = text ? JSON.parse(text) : null; } catch { parsed = null; }
  if (answer.ok) return parsed;
  const code = parsed?.error || `http_${answer.status}`;
  const message = parsed?.message || text.slice(0, 200);
  if (answer.status === 409 && REASONS.has(code)) throw new Rejected(code, message);
  throw new ApiError(answer.status, code, message, Number(answer.headers.get("retry-after")) || null);
}

// Reports are repeated through transient errors: Koala answers a repeat already_recorded.
async function persist(fn) {
  for (let failures = 1; ; failures++) {
    try { return await fn(); } catch (err) {
      if (!(err instanceof ApiError) || !err.transient || failures > 12) throw err;
      await sleep(err.status === 429 && err.retryAfter ? err.retryAfter * 1000 : backoff(failures));
    }
  }
}

let workerId = "";
let reg = null;
const held = new Map(); // lease_id -> {lease, abort, beat, started}
let stopping = false;
const stopPoll = new AbortController();
let slotFreed = () => {};

async function register() {
  for (let failures = 1; !stopping; failures++) {
    try {
      reg = await call("/api/v1/workers/register", {
        ...(NAME ? { name: NAME } : {}), hostname: os.hostname(), pid: process.pid, kinds: [...KINDS, ...WORKFLOWS],
        concurrency: CONCURRENCY, sdk: "koala-node-example/0.1",
      });
      workerId = reg.worker_id;
      log(`registered as ${workerId} for ${reg.kinds.join(", ")}`);
      return;
    } catch (err) {
      if (!(err instanceof ApiError) || !err.transient) throw err;
      await sleep(backoff(failures), stopPoll.signal);
    }
  }
}

const lease_path = (lease, what) => `/api/v1/leases/${lease.lease_id}/${what}`;
const about = (lease, extra) => ({ worker_id: workerId, lease_token: lease.lease_token, ...extra });

// One report about a lease, the four 409 reasons handled by name.
async function report(lease, what, extra) {
  try {
    await persist(() => call(lease_path(lease, what), about(lease, extra)));
  } catch (err) {
    if (err instanceof Rejected) {
      if (err.reason === "already_recorded") return; // a repeat after a lost answer: done
      log(`lease ${lease.lease_id} (job ${lease.job_id}): ${err.reason}; dropped, nothing more reported`);
      return; // lease_expired / lease_superseded / job_cancelled: the outcome is not ours
    }
    log(`lease ${lease.lease_id}: ${what} refused: ${err.message}`);
  }
}

async function echoBody(input, signal) {
  const delay = Number(input?.delay_ms || 0);
  if (delay > 0) await sleep(delay, signal);
  return { echo: input };
}

async function run(lease) {
  const entry = { lease, abort: new AbortController(), lost: false, reported: false, started: false };
  held.set(lease.lease_id, entry);
  try {
    const body = bodyFor(lease);
    if (!body) {
      entry.reported = true;
      const where = `${lease.kind}@${lease.version}${lease.step ? ` step ${lease.step}` : ""}`;
      await report(lease, "fail", { classification: "unservable", error_class: "Unservable", message: `no body for ${where}` });
      return;
    }
    if (stopping) {
      entry.reported = true;
      await report(lease, "fail", { classification: "released", error_class: "Released", message: "shutting down", body_started: false });
      return;
    }
    entry.started = true;
    const every = Math.max(100, (lease.heartbeat_seconds || lease.lease_seconds / 3) * 1000);
    entry.beat = setInterval(async () => {
      try {
        const answer = await call(lease_path(lease, "heartbeat"), about(lease, {}), { timeoutMs: every });
        if (answer?.cancel) entry.abort.abort("stop_pause");
      } catch (err) {
        if (err instanceof Rejected) { entry.lost = true; entry.abort.abort(err.reason); log(`lease ${lease.lease_id}: ${err.reason}; stopping the body`); }
        else if (err instanceof ApiError && err.status === 404) { entry.lost = true; entry.abort.abort("unknown_lease"); }
        // transient: the next beat tries again, well inside the lease
      }
    }, every);
    let result, failure;
    try { result = await body(lease.input, entry.abort.signal, lease); } catch (err) { failure = err; }
    clearInterval(entry.beat);
    if (entry.lost || entry.reported) return; // lost (409 on a heartbeat) or given back at the deadline
    entry.reported = true;
    if (entry.abort.signal.aborted) {
      // Asked to stop (a stop pause or our shutdown) and stopped at a safe point: give it back.
      await report(lease, "fail", { classification: "released", error_class: "Released", message: String(entry.abort.signal.reason), body_started: true, safe_point: true });
    } else if (failure) {
      await report(lease, "fail", { classification: "fatal", error_class: failure?.name || "Error", message: String(failure?.message || failure) });
    } else {
      await report(lease, "complete", { output: result.output, ...(result.state ? { state_delta: result.state } : {}) });
    }
  } finally {
    clearInterval(entry.beat);
    held.delete(lease.lease_id);
    slotFreed();
  }
}

async function serve() {
  await register();
  for (let failures = 0; !stopping; ) {
    const free = Math.min(CONCURRENCY, reg.concurrency) - held.size;
    if (free <= 0) { await new Promise((resolve) => { slotFreed = resolve; }); continue; }
    let answer;
    try {
      answer = await call(`/api/v1/workers/${encodeURIComponent(workerId)}/acquire`, { max: free, wait_seconds: reg.poll_seconds },
        { signal: stopPoll.signal, timeoutMs: (reg.poll_seconds + 30) * 1000 });
      failures = 0;
    } catch (err) {
      if (stopping) break;
      if (err instanceof ApiError && err.status === 404) { log("Koala does not know this worker any more; registering again"); await register(); continue; }
      if (!(err instanceof ApiError) || !(err.transient || err.status === 401)) throw err;
      failures++;
      await sleep(err.status === 429 && err.retryAfter ? err.retryAfter * 1000 : backoff(failures), stopPoll.signal);
      continue;
    }
    for (const lease of answer?.leases || []) run(lease);
  }
}

async function shutDown() {
  for (const entry of held.values()) if (entry.started) entry.abort.abort("shutdown");
  const deadline = Date.now() + SHUTDOWN_DEADLINE_MS;
  while (held.size && Date.now() < deadline) await sleep(50);
  for (const entry of held.values()) {
    if (entry.reported || entry.lost) continue;
    entry.reported = true;
    await report(entry.lease, "fail", { classification: "released", error_class: "Released", message: "shutting down", body_started: entry.started, safe_point: false });
  }
  const answer = await stopCall("stopped");
  log(`exit ${answer?.exited ? "recorded" : "not recorded"}`);
}

// The stop call: Koala answers this worker's open acquire at once (with no lease) and records its
// exit once it holds no lease. Without an answer (an old server, Koala away), the long-poll is cut
// here instead, which is safe too: Koala gives back whatever it claimed for a request that left.
async function stopCall(reason) {
  if (!workerId) return null;
  try {
    return await call(`/api/v1/workers/${encodeURIComponent(workerId)}/stop`, { reason }, { timeoutMs: 5_000 });
  } catch (err) {
    log(`stop call: ${err.message}`);
    return null;
  }
}

function onSignal(name) {
  if (stopping) return;
  log(`${name}: stopping`);
  stopping = true;
  slotFreed();
  stopCall(name).then((answer) => { if (!answer) stopPoll.abort(); });
}

process.on("SIGTERM", () => onSignal("SIGTERM"));
process.on("SIGINT", () => onSignal("SIGINT"));

try {
  await serve();
  await shutDown();
  log("stopped");
  process.exit(0);
} catch (err) {
  log(`fatal: ${err.message}`);
  process.exit(1);
}
