// Driven by tests/e2e/test_ts_artifacts.py: the TypeScript SDK client (@modelcontextprotocol/client
// 2.4.0, 2026-07-28) reads one artifact with readResource and prints one JSON line: the content's
// uri, mimeType, which field held it (text or blob), its byte count and sha256.
import { createHash } from "node:crypto";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, uri] = process.argv.slice(2);
const client = new Client({ name: "read-artifact-e2e", version: "2.4.0" }, {
  capabilities: {},
  versionNegotiation: { mode: { pin: "2026-07-28" } },
});
try {
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  const result = await client.readResource({ uri });
  const [content] = result.contents;
  const bytes = "blob" in content ? Buffer.from(content.blob, "base64") : Buffer.from(content.text, "utf8");
  console.log(JSON.stringify({
    uri: content.uri,
    mimeType: content.mimeType,
    field: "blob" in content ? "blob" : "text",
    size: bytes.length,
    sha256: createHash("sha256").update(bytes).digest("hex"),
    count: result.contents.length,
  }));
} catch (error) {
  console.log(JSON.stringify({ error: String(error?.stack ?? error), code: error?.code ?? null }));
} finally {
  await client.close();
}
