// Driven by tests/e2e/test_peers.py: @modelcontextprotocol/client 2.4.0 with the tasks
// extension's requester (@modelcontextprotocol/ext-tasks 0.2.2) against our server, 2026-07-28.
// Prints one JSON line per step. The package needs a host-owned raw request path for SEP-2663
// traffic (the SDK's codecs reject `resultType: "task"`): `rawDispatch` below is a plain fetch.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { createApplicationInputHandler, createTaskSessionFromClient } from "@modelcontextprotocol/ext-tasks/client";

const url = process.argv[2];
// An optional bearer token (argv[3]): a host app that mounts MCP behind its own API keys.
const auth = process.argv[3] ? { authorization: `Bearer ${process.argv[3]}` } : {};
const VERSION = "2026-07-28";
const clientInfo = { name: "ext-tasks-e2e", version: "0.2.2" };
const clientCapabilities = { elicitation: {}, sampling: {}, roots: {}, extensions: { "io.modelcontextprotocol/tasks": {} } };
const say = (step, data = {}) => console.log(JSON.stringify({ step, ...data }));

let nextId = 0;

async function rawDispatch(unframed, options) {
  // The package hands over {method, params}; the host owns the JSON-RPC envelope.
  const request = { jsonrpc: "2.0", id: `raw-${++nextId}`, ...unframed };
  const params = request.params ?? {};
  const name = request.method === "tools/call" ? params.name : params.taskId;
  const headers = {
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    "mcp-protocol-version": VERSION,
    "mcp-method": request.method,
    ...(name ? { "mcp-name": String(name) } : {}),
    ...auth,
    ...(options?.headers ?? {}),
  };
  const response = await fetch(url, { method: "POST", headers, body: JSON.stringify(request), signal: options?.signal });
  const text = await response.text();
  let message;
  if ((response.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
    const messages = text.split("\n").filter((line) => line.startsWith("data:")).map((line) => JSON.parse(line.slice(5)));
    message = messages.find((entry) => entry.id === request.id) ?? messages.at(-1);
  } else {
    message = JSON.parse(text);
  }
  // The port's response shape: a tagged result or error.
  return "error" in message ? { kind: "error", error: message.error } : { kind: "result", result: message.result };
}

const asked = [];
const onInputRequest = createApplicationInputHandler({
  elicitation: async (request) => {
    asked.push(["elicitation", request.params.message]);
    return { action: "accept", content: { confirm: true } };
  },
  sampling: async () => {
    asked.push(["sampling"]);
    return { model: "e2e-model", role: "assistant", content: { type: "text", text: "Paris" } };
  },
  roots: async () => {
    asked.push(["roots"]);
    return { roots: [{ uri: "file:///e2e", name: "e2e" }] };
  },
});

const client = new Client(clientInfo, { capabilities: {}, versionNegotiation: { mode: { pin: VERSION } } });
await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: auth } }));
say("connected", { era: client.getProtocolEra?.() ?? null });
const session = createTaskSessionFromClient(client, {
  endpointId: "e2e",
  rawDispatch,
  v2RequestFraming: { protocolVersion: VERSION, clientInfo, clientCapabilities },
  onInputRequest,
});

const text = (outcome) => (outcome.status === "completed" ? outcome.result.content?.[0]?.text : outcome.status);

try {
  const task = await session.callTool("slow_compute", { seconds: 0.5 });
  const settled = await task.settle();
  say("task", { kind: task.kind, status: settled.outcome.status, text: text(settled.outcome) });

  const elicited = await session.callTool("confirm_delete", { filename: "a.txt" });
  say("elicitation", { kind: elicited.kind, text: text((await elicited.settle()).outcome), asked: asked.splice(0) });

  const sampled = await session.callTool("t_sample_and_roots", {});
  const sampledOutcome = (await sampled.settle()).outcome;
  say("sampling", { kind: sampled.kind, status: sampledOutcome.status, asked: asked.splice(0).map((a) => a[0]).sort() });

  const synchronous = await session.callTool("test_input_required_result_sampling", {});
  say("sync-sampling", { kind: synchronous.kind, text: text((await synchronous.settle()).outcome), asked: asked.splice(0) });

  const spinning = await session.callTool("spin", { seconds: 30 });
  await spinning.cancel();
  say("cancel", { kind: spinning.kind, status: (await spinning.settle()).outcome.status });
} catch (error) {
  say("error", { message: String(error?.stack ?? error), cause: String(error?.cause ?? "") });
} finally {
  await session.close();
  await client.close();
}
