// Driven by tests/e2e/test_legacy.py with the TypeScript SDK 1.32.2 (a 2025-11-25 client):
// calls a tool as a SEP-1686 task through client.experimental.tasks.callToolStream and prints
// one JSON line per message it receives.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema, LoggingMessageNotificationSchema, ResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, tool, args] = process.argv.slice(2);
const client = new Client({ name: "ts-sdk-1", version: "1.32.2" }, { capabilities: {} });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
console.log(JSON.stringify({ step: "connected", tasks: client.getServerCapabilities()?.tasks ?? null }));
const stream = client.experimental.tasks.callToolStream(
  { name: tool, arguments: JSON.parse(args ?? "{}") },
  CallToolResultSchema,
  { task: { ttl: 60000 } },
);
for await (const message of stream) {
  if (message.type === "taskCreated") console.log(JSON.stringify({ step: "taskCreated", status: message.task.status }));
  else if (message.type === "taskStatus") console.log(JSON.stringify({ step: "taskStatus", status: message.task.status }));
  else if (message.type === "result") console.log(JSON.stringify({ step: "result", text: message.result.content[0].text }));
  else if (message.type === "error") console.log(JSON.stringify({ step: "error", message: String(message.error?.message ?? message.error) }));
}
// A synchronous call with an onprogress callback (a progressToken) and logs at "info".
const steps = [];
const logs = [];
client.setNotificationHandler(LoggingMessageNotificationSchema, (notification) => {
  logs.push(notification.params.data);
});
const progressed = await client.callTool({ name: "test_tool_with_progress", arguments: {} }, CallToolResultSchema, {
  onprogress: (progress) => steps.push([progress.progress, progress.total]),
});
console.log(JSON.stringify({ step: "progress", text: progressed.content[0].text, steps }));
await client.setLoggingLevel("info");
const logged = await client.callTool({ name: "test_tool_with_logging", arguments: {} });
console.log(JSON.stringify({ step: "logs", text: logged.content[0].text, logs }));
// The hosts' gaps this client showed (issue 34): a tool that reports only messages gives a
// caller with onprogress no progress at all; tasks/list counted plain synchronous calls.
const messages = [];
const reported = await client.callTool({ name: "slow_compute", arguments: { seconds: 0.6 } }, CallToolResultSchema, {
  onprogress: (progress) => messages.push([progress.progress, progress.message ?? null]),
});
console.log(JSON.stringify({ step: "message-progress", text: reported.content[0].text, messages }));
const listed = await client.request({ method: "tasks/list", params: {} }, ResultSchema);
console.log(JSON.stringify({ step: "list", tasks: listed.tasks.length }));
await client.close();
