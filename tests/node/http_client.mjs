// A client of keyload's HTTP API written without keyload's Python SDK: Node 20's built-in fetch
// and nothing else (no npm packages). It proves the API is usable from another language by the
// rules of keyload/wire.py alone: JSON records named as in schemas/keyload.Command.avsc, bytes as
// base64, the outcome (schemas/keyload.Outcome.avsc) as the response with its HTTP status.
//
// Usage: node tests/node/http_client.mjs URL TOKEN
//   URL    the service's base URL (DATA/server.json "url")
//   TOKEN  a bearer token (the part after "Bearer ")
//
// Each run uses a domain of its own. Every step asserts its HTTP status and the fields it relies on;
// the first mismatch ends the run with exit code 1 and a message naming the step. On success it
// prints `node client: N steps passed` and exits 0.

import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";

const REQUEST_TIMEOUT_MS = 60_000; // one request, long polls included (each waits at most 2 s here)
const REDELIVERY_BUDGET_MS = 20_000; // how long the nacked message may take to come back
const POLL_WAIT_MS = 2_000; // the long poll of each receive while waiting for it

const [url, token] = process.argv.slice(2);
if (!url || !token) {
  console.error("usage: node http_client.mjs URL TOKEN");
  process.exit(2);
}
const base = url.replace(/\/+$/, "");
const domain = `node-${randomBytes(6).toString("hex")}`;
const queue = "jobs";
const topic = "events";
const group = "readers";
const q = `/v1/domains/${domain}/queues/${queue}`;
const t = `/v1/domains/${domain}/topics/${topic}`;
const g = `${t}/groups/${group}`;
const leases = `/v1/domains/${domain}/leases`;

const b64 = (bytes) => Buffer.from(bytes).toString("base64");
const unb64 = (text) => Buffer.from(text, "base64");

let passed = 0;
let current = "start";

// Run one named step: any failure inside it names the step.
async function step(name, body) {
  current = name;
  const value = await body();
  passed += 1;
  return value;
}

// Send a request; return {status, body} with the body parsed as JSON (asserted to be JSON).
async function call(method, path, { json, auth = true, headers = {} } = {}) {
  const sent = { ...headers };
  if (auth) sent.Authorization = `Bearer ${token}`;
  if (json !== undefined) sent["Content-Type"] = "application/json";
  const response = await fetch(base + path, {
    method,
    headers: sent,
    body: json === undefined ? undefined : JSON.stringify(json),
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  const text = await response.text();
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    assert.fail(`${method} ${path}: HTTP ${response.status} with a body that is not JSON: ${text.slice(0, 300)}`);
  }
  return { status: response.status, body, header: (name) => response.headers.get(name) };
}

// A committed outcome: HTTP 200, status "committed", no error code; returns its result record.
function committed(what, response) {
  const { status, body } = response;
  const shown = JSON.stringify(body).slice(0, 500);
  assert.equal(status, 200, `${what}: HTTP ${status}, expected 200: ${shown}`);
  assert.equal(body.status, "committed", `${what}: status ${body.status}: ${shown}`);
  assert.equal(body.error_code, null, `${what}: error_code ${body.error_code}: ${shown}`);
  assert.equal(body.domain, domain, `${what}: outcome of domain ${body.domain}`);
  assert.equal(typeof body.command_id, "string", `${what}: no command_id`);
  assert.equal(response.header("keyload-command-id"), body.command_id, `${what}: Keyload-Command-Id header`);
  assert.equal(typeof body.offset, "number", `${what}: no offset`);
  assert.ok(body.result !== null && typeof body.result === "object", `${what}: no result: ${shown}`);
  return body.result;
}

async function main() {
  const body = Buffer.concat([Buffer.from("hello from node \u00e9 "), randomBytes(16), Buffer.from([0, 255])]);
  const messageId = `m-${randomUUID()}`;

  await step("create queue", async () => {
    const view = committed("create queue", await call("PUT", q, { json: { policy: {} } }));
    assert.equal(view.domain, domain, "create queue: view.domain");
    assert.equal(view.queue, queue, "create queue: view.queue");
    assert.equal(typeof view.policy, "object", "create queue: view.policy");
  });

  await step("enqueue", async () => {
    const result = committed(
      "enqueue",
      await call("POST", `${q}/messages`, { json: { message_id: messageId, body: b64(body) } }),
    );
    assert.equal(result.queue, queue, "enqueue: result.queue");
    assert.equal(result.message_id, messageId, "enqueue: result.message_id");
    assert.equal(result.state, "ready", "enqueue: result.state");
    assert.equal(result.stored_messages, 1, "enqueue: result.stored_messages");
  });

  const first = await step("receive", async () => {
    const result = committed("receive", await call("POST", `${q}/receive`, { json: { max_messages: 1 } }));
    assert.equal(result.deliveries.length, 1, "receive: one delivery");
    const [delivery] = result.deliveries;
    assert.equal(delivery.message_id, messageId, "receive: message_id");
    assert.equal(delivery.attempts, 1, "receive: attempts");
    assert.ok(unb64(delivery.body).equals(body), "receive: body bytes differ from those enqueued");
    assert.equal(typeof delivery.token, "string", "receive: token");
    assert.ok(delivery.token.length > 0, "receive: empty token");
    return delivery;
  });

  await step("nack", async () => {
    const result = committed("nack", await call("POST", `${leases}/nack`, { json: { token: first.token, delay_ms: 0 } }));
    assert.equal(result.message_id, messageId, "nack: result.message_id");
    assert.ok(["scheduled", "ready"].includes(result.state), `nack: result.state ${result.state}`);
    assert.equal(result.lease_until_ms, null, "nack: result.lease_until_ms");
  });

  const second = await step("receive after nack", async () => {
    const deadline = Date.now() + REDELIVERY_BUDGET_MS;
    let polls = 0;
    while (Date.now() < deadline) {
      polls += 1;
      const result = committed(
        `receive after nack (poll ${polls})`,
        await call("POST", `${q}/receive`, { json: { max_messages: 1, wait_ms: POLL_WAIT_MS } }),
      );
      if (result.deliveries.length === 0) continue;
      assert.equal(result.deliveries.length, 1, "receive after nack: at most one delivery");
      const [delivery] = result.deliveries;
      assert.equal(delivery.message_id, messageId, "receive after nack: message_id");
      assert.equal(delivery.attempts, 2, "receive after nack: attempts");
      assert.ok(unb64(delivery.body).equals(body), "receive after nack: body bytes differ from those enqueued");
      assert.notEqual(delivery.token, first.token, "receive after nack: the token of the first lease again");
      return delivery;
    }
    assert.fail(`receive after nack: the message did not come back within ${REDELIVERY_BUDGET_MS} ms (${polls} polls)`);
  });

  await step("ack", async () => {
    const result = committed("ack", await call("POST", `${leases}/ack`, { json: { token: second.token } }));
    assert.equal(result.message_id, messageId, "ack: result.message_id");
    assert.equal(result.state, "acked", "ack: result.state");
  });

  await step("ack the same token again (StaleLease)", async () => {
    const what = "ack the same token again";
    const { status, body: outcome } = await call("POST", `${leases}/ack`, { json: { token: second.token } });
    const shown = JSON.stringify(outcome).slice(0, 500);
    assert.ok(status < 200 || status > 299, `${what}: HTTP ${status}, expected a non-2xx status: ${shown}`);
    assert.equal(outcome.status, "rejected", `${what}: status: ${shown}`);
    assert.equal(outcome.error_code, "StaleLease", `${what}: error_code: ${shown}`);
    assert.equal(outcome.result, null, `${what}: result: ${shown}`);
    assert.equal(typeof outcome.detail, "string", `${what}: detail`);
  });

  await step("request without Authorization (401)", async () => {
    const what = "request without Authorization";
    const { status, body: error } = await call("POST", `${q}/receive`, { json: { max_messages: 1 }, auth: false });
    const shown = JSON.stringify(error).slice(0, 500);
    assert.equal(status, 401, `${what}: HTTP ${status}, expected 401: ${shown}`);
    assert.equal(error.status, "error", `${what}: status: ${shown}`);
    assert.equal(error.error_code, "Unauthenticated", `${what}: error_code: ${shown}`);
  });

  await step("create topic", async () => {
    const view = committed("create topic", await call("PUT", t, { json: { policy: {} } }));
    assert.equal(view.domain, domain, "create topic: view.domain");
    assert.equal(view.topic, topic, "create topic: view.topic");
    assert.equal(view.tail, 0, "create topic: view.tail");
  });

  await step("create group", async () => {
    const view = committed(
      "create group",
      await call("PUT", g, { json: { filter: {}, start: "beginning", policy: {} } }),
    );
    assert.equal(view.state.topic, topic, "create group: state.topic");
    assert.equal(view.state.group, group, "create group: state.group");
    assert.equal(view.state.checkpoint, 0, "create group: state.checkpoint");
    assert.equal(view.lag, 0, "create group: lag");
  });

  const eventBody = Buffer.concat([Buffer.from("event from node "), randomBytes(8)]);
  const eventId = `e-${randomUUID()}`;
  const position = await step("publish", async () => {
    const result = committed(
      "publish",
      await call("POST", `${t}/events`, {
        json: { events: [{ event_id: eventId, type: "node.test", headers: { origin: "node" }, body: b64(eventBody) }] },
      }),
    );
    assert.equal(result.topic, topic, "publish: result.topic");
    assert.equal(result.events.length, 1, "publish: one event");
    assert.equal(result.events[0].event_id, eventId, "publish: event_id");
    assert.equal(result.events[0].position, 1, "publish: position");
    return result.events[0].position;
  });

  const delivered = await step("group receive", async () => {
    const result = committed(
      "group receive",
      await call("POST", `${g}/receive`, { json: { max_events: 1, wait_ms: POLL_WAIT_MS } }),
    );
    assert.equal(result.deliveries.length, 1, "group receive: one delivery");
    const [delivery] = result.deliveries;
    assert.equal(delivery.position, position, "group receive: position");
    assert.equal(delivery.event_id, eventId, "group receive: event_id");
    assert.equal(delivery.type, "node.test", "group receive: type");
    assert.deepEqual(delivery.headers, { origin: "node" }, "group receive: headers");
    assert.equal(delivery.attempts, 1, "group receive: attempts");
    assert.ok(unb64(delivery.body).equals(eventBody), "group receive: body bytes differ from those published");
    assert.equal(typeof delivery.token, "string", "group receive: token");
    return delivery;
  });

  await step("group ack", async () => {
    const result = committed("group ack", await call("POST", `${g}/ack`, { json: { token: delivered.token } }));
    assert.equal(result.position, position, "group ack: position");
    assert.equal(result.state, "acked", "group ack: state");
    assert.equal(result.checkpoint, position, "group ack: checkpoint");
  });

  console.log(`node client: ${passed} steps passed`);
}

try {
  await main();
} catch (error) {
  const cause = error?.cause ? ` (${error.cause.code ?? error.cause.message ?? error.cause})` : "";
  console.error(`node client: step "${current}" failed: ${error?.message ?? error}${cause}`);
  process.exit(1);
}
