"""A Herald webhook receiver in Python, verifying with the `standardwebhooks` package.

    pip install -r requirements.txt
    WEBHOOK_SECRET=whsec_... python3 receiver.py --port 9001
    WEBHOOK_SECRET=whpk_... python3 receiver.py --port 9001   # an Ed25519 SigningSecret

Herald signs the Standard Webhooks way, so the reference library verifies its requests
(`v1`, HMAC); Ed25519 signatures (`v1a`) are checked with the cryptography package.
Answers 204 for a valid signature (and for a duplicate: delivery is at-least-once, so the
receiver deduplicates on `webhook-id`), 401 otherwise. A verification challenge
(`herald.endpoint.verification`, sent before the first delivery to an endpoint with
`spec.verify`) with a valid signature is answered 200 with the challenge.
"""

import argparse
import base64
import binascii
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

TOLERANCE_SECONDS = 5 * 60


def verify_v1a(public_key, headers, body):
    """Checks an Ed25519 (`v1a`) signature with a `whpk_...` public key, for a
    SigningSecret of `algorithm: Ed25519`. The standardwebhooks package (1.x) checks only
    `v1` (HMAC) signatures, so this uses the cryptography package on the same signed
    content, `id.timestamp.body`, with the same timestamp tolerance."""
    headers = {k.lower(): v for k, v in headers.items()}
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise WebhookVerificationError("Missing required headers")
    try:
        age = time.time() - int(timestamp)
    except ValueError:
        raise WebhookVerificationError("Invalid Signature Headers")
    if abs(age) > TOLERANCE_SECONDS:
        raise WebhookVerificationError("Message timestamp too old" if age > 0 else "Message timestamp too new")
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key.removeprefix("whpk_"), validate=True))
    except (ValueError, binascii.Error):
        raise WebhookVerificationError("the public key is not whpk_ and the base64 of 32 bytes")
    content = f"{msg_id}.{timestamp}.".encode() + body
    for entry in signatures.split(" "):
        version, _, encoded = entry.partition(",")
        if version != "v1a":
            continue
        try:
            key.verify(base64.b64decode(encoded, validate=True), content)
            return json.loads(body)
        except (InvalidSignature, ValueError, binascii.Error):
            continue
    raise WebhookVerificationError("No matching signature found")


def verify(secrets, headers, body):
    """Returns the event if one of `secrets` (two while a rotation overlaps) signed it;
    raises WebhookVerificationError otherwise. A secret is `whsec_...` (HMAC) or, for an
    Ed25519 SigningSecret, the public key `whpk_...` from its status. Also refuses
    timestamps older or newer than 5 minutes (replayed requests)."""
    error = WebhookVerificationError("no secret configured")
    for secret in secrets:
        try:
            if secret.startswith("whpk_"):
                return verify_v1a(secret, headers, body)
            return Webhook(secret).verify(body, headers)
        except WebhookVerificationError as e:
            error = e
    raise error


VERIFICATION = "herald.endpoint.verification"

# The server handles each request in a thread of its own: one lock makes checking and
# recording a webhook-id one step (two concurrent deliveries of one event, a retry racing
# a slow first attempt, must not both be taken for new) and keeps output lines whole.
lock = threading.Lock()


def log(line):
    with lock:
        print(line, flush=True)


def challenge_answer(event):
    """The body that answers Herald's verification challenge when `event` (already
    verified) is one: the challenge itself, echoed with a 200. None for other events."""
    if event.get("type") != VERIFICATION:
        return None
    return json.dumps({"challenge": event["data"]["challenge"]})


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
                log(f"{self.path} 401 rejected: {e}")
                self.send_response(401)
                self.end_headers()
                return
            msg_id = self.headers["webhook-id"]
            answer = challenge_answer(event)
            if answer is not None:
                log(f"{self.path} 200 {msg_id} verification challenge echoed")
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(answer.encode())
                return
            with lock:
                duplicate = (self.path, msg_id) in seen
                seen.add((self.path, msg_id))
            note = " (duplicate, ignored)" if duplicate else ""
            log(f"{self.path} 204 {msg_id} {event['type']} {json.dumps(event['data'])}{note}")
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    print(f"listening on http://127.0.0.1:{args.port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
