// Driven by tests/e2e/test_ts_artifacts.py: the TypeScript SDK client (@modelcontextprotocol/client
// 2.4.0, 2026-07-28) reads one artifact with readResource and prints one JSON line: the content's
// uri, mimeType, which field held it (text or blob), its byte count and sha256. Given the link's
// size above one read's limit (16 MiB), it reads the artifact in ranges (the server's
// `{?offset,length}` template), hashing each part as it comes; `count` is then the parts read.
import { createHash } from "node:crypto";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, uri, sizeArg] = process.argv.slice(2);
const MAX_READ = 16 * 1024 * 1024;
const size = sizeArg === undefined ? 0 : Number(sizeArg);
const client = new Client({ name: "read-artifact-e2e", version: "2.4.0" }, {
  capabilities: {},
  versionNegotiation: { mode: { pin: "2026-07-28" } },
});
try {
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  if (size > MAX_READ) {
    const sha = createHash("sha256");
    let total = 0, count = 0, mimeType = null, field = "blob";
    for (let offset = 0; offset < size; offset += MAX_READ) {
      const part = await client.readResource({ uri: `${uri}?offset=${offset}&length=${MAX_READ}` });
      const [content] = part.contents;
      if (!("blob" in content)) field = "text";
      const bytes = Buffer.from(content.blob ?? "", "base64");
      sha.update(bytes);
      total += bytes.length;
      count += part.contents.length;
      mimeType = content.mimeType;
    }
    console.log(JSON.stringify({ uri, mimeType, field, size: total, sha256: sha.digest("hex"), count }));
  } else {
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
  }
} catch (error) {
  console.log(JSON.stringify({ error: String(error?.stack ?? error), code: error?.code ?? null }));
} finally {
  await client.close();
}
