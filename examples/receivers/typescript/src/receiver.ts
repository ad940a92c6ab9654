// A Herald webhook receiver in TypeScript (Node's http module), verifying with the
// official Standard Webhooks package, `standardwebhooks`.
//
//   npm ci && npm run build
//   WEBHOOK_SECRET=whsec_... node dist/receiver.js --port 9003
//
// Answers 204 for a valid signature, also for a duplicate (delivery is at-least-once: a
// retry, a replay or a redelivery after a dispatcher restart carries the same webhook-id),
// which is then not processed again; 401 for a bad signature or a timestamp more than 5
// minutes away. Prints `processed <webhook-id> <type>` or `duplicate <webhook-id>` per
// request.

import { createServer, type IncomingMessage } from "node:http";
import { Webhook, WebhookVerificationError } from "standardwebhooks";

interface HeraldEvent {
  type: string;
  timestamp: string;
  data: unknown;
}

// How many webhook-ids the receiver remembers. A real receiver keeps them in its database
// (for longer than Herald retries and replays: days), in the same transaction as the
// effect of the event; memory is enough for an example.
const REMEMBERED = 10_000;

// The keys seen: the path and the webhook-id. The path is in the key because Herald sends
// an event to each of a namespace's endpoints that match it with the same webhook-id: a
// receiver serving several endpoints (one path each) processes it once per endpoint.
// A Set iterates in insertion order, so its first entry is the oldest: a bounded set.
// Node runs one handler at a time, so checking and recording cannot interleave.
const seen = new Set<string>();
function firstTime(key: string): boolean {
  if (seen.has(key)) return false;
  seen.add(key);
  if (seen.size > REMEMBERED) seen.delete(seen.values().next().value as string);
  return true;
}

// One Webhook per secret: two while a key rotation overlaps. Herald signs with every key
// of an overlap, so either secret alone suffices.
const webhooks = (process.env.WEBHOOK_SECRET ?? "")
  .split(",")
  .filter((s) => s !== "")
  .map((s) => new Webhook(s));

// Returns the event when one of the secrets signed the raw body; throws otherwise.
function verify(body: Buffer, headers: Record<string, string>): HeraldEvent {
  let error = new WebhookVerificationError("no secret configured");
  for (const wh of webhooks) {
    try {
      return wh.verify(body, headers) as HeraldEvent;
    } catch (e) {
      if (!(e instanceof WebhookVerificationError)) throw e;
      error = e;
    }
  }
  throw error;
}

async function rawBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

const portFlag = process.argv.indexOf("--port");
const port = portFlag > 0 ? Number(process.argv[portFlag + 1]) : 9003;

createServer(async (req, res) => {
  if (req.method !== "POST") {
    res.writeHead(405).end();
    return;
  }
  // The signature covers the raw bytes: verify them, not a re-serialized object.
  const body = await rawBody(req);
  const headers: Record<string, string> = {};
  for (const name of ["webhook-id", "webhook-timestamp", "webhook-signature"]) {
    const value = req.headers[name];
    if (typeof value === "string") headers[name] = value;
  }
  let event: HeraldEvent;
  try {
    event = verify(body, headers);
  } catch (e) {
    console.log(`rejected ${(e as Error).message}`);
    res.writeHead(401).end();
    return;
  }
  const id = headers["webhook-id"];
  // Herald's endpoint verification (an endpoint with spec.verify): echo the challenge.
  // Its webhook-id is fresh each time, so it needs no deduplication.
  if (event.type === "herald.endpoint.verification") {
    console.log(`challenge ${id}`);
    const { challenge } = event.data as { challenge: string };
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ challenge }));
    return;
  }
  if (!firstTime(`${req.url} ${id}`)) {
    console.log(`duplicate ${id}`);
    res.writeHead(204).end();
    return;
  }
  console.log(`processed ${id} ${event.type}`);
  res.writeHead(204).end();
}).listen(port, "127.0.0.1", () => console.log(`listening on http://127.0.0.1:${port}`));
