"""A Herald webhook receiver in Python, verifying with the `standardwebhooks` package.

    pip install -r requirements.txt
    WEBHOOK_SECRET=whsec_... python3 receiver.py --port 9001

Herald signs the Standard Webhooks way, so the reference library verifies its requests.
Answers 204 for a valid signature (and for a duplicate: delivery is at-least-once, so the
receiver deduplicates on `webhook-id`), 401 otherwise.
"""

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def verify(secrets, headers, body):
    """Returns the event if one of `secrets` (two while a rotation overlaps) signed it;
    raises WebhookVerificationError otherwise. Also refuses timestamps older or newer
    than 5 minutes (replayed requests)."""
    error = WebhookVerificationError("no secret configured")
    for secret in secrets:
        try:
            return Webhook(secret).verify(body, headers)
        except WebhookVerificationError as e:
            error = e
    raise error


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9001)
    args = parser.parse_args()
    secrets = [s for s in os.environ.get("WEBHOOK_SECRET", "").split(",") if s]
    seen = set()  # (path, webhook-id); a real receiver keeps them in its database for days

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            try:
                event = verify(secrets, dict(self.headers), body)
            except WebhookVerificationError as e:
                print(f"{self.path} 401 rejected: {e}", flush=True)
                self.send_response(401)
                self.end_headers()
                return
            msg_id = self.headers["webhook-id"]
            duplicate = (self.path, msg_id) in seen
            seen.add((self.path, msg_id))
            note = " (duplicate, ignored)" if duplicate else ""
            print(f"{self.path} 204 {msg_id} {event['type']} {json.dumps(event['data'])}{note}", flush=True)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    print(f"listening on http://127.0.0.1:{args.port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
