// A Herald webhook receiver in Java (the JDK's com.sun.net.httpserver), verifying with the
// official Standard Webhooks library, com.standardwebhooks:standardwebhooks.
//
//   mvn -q package
//   WEBHOOK_SECRET=whsec_... java -cp 'target/receiver.jar:target/lib/*' dev.herald.receiver.Receiver --port 9004
//
// Answers 204 for a valid signature, also for a duplicate (delivery is at-least-once: a
// retry, a replay or a redelivery after a dispatcher restart carries the same webhook-id),
// which is then not processed again; 401 for a bad signature or a timestamp more than 5
// minutes away. Prints `processed <webhook-id> <type>` or `duplicate <webhook-id>` per
// request.
package dev.herald.receiver;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.standardwebhooks.Webhook;
import com.standardwebhooks.exceptions.WebhookVerificationException;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Executors;

public final class Receiver {
    // How many webhook-ids the receiver remembers. A real receiver keeps them in its
    // database (for longer than Herald retries and replays: days), in the same transaction
    // as the effect of the event; memory is enough for an example.
    private static final int REMEMBERED = 10_000;

    // The keys seen: the path and the webhook-id. The path is in the key because Herald
    // sends an event to each of a namespace's endpoints that match it with the same
    // webhook-id: a receiver serving several endpoints (one path each) processes it once
    // per endpoint. A bounded set: a LinkedHashMap (in insertion order) drops its eldest
    // entry past the bound.
    // Synchronized, so that two concurrent deliveries of one event (a retry racing a slow
    // first attempt) cannot both be taken for new: Set.add checks and records at once.
    private static final Set<String> SEEN = Collections.synchronizedSet(Collections.newSetFromMap(
            new LinkedHashMap<String, Boolean>(16, 0.75f, false) {
                @Override
                protected boolean removeEldestEntry(Map.Entry<String, Boolean> eldest) {
                    return size() > REMEMBERED;
                }
            }));

    private static final ObjectMapper JSON = new ObjectMapper();

    private final List<Webhook> webhooks = new ArrayList<>();

    Receiver(String secrets) throws Exception {
        // One Webhook per secret: two while a key rotation overlaps. Herald signs with
        // every key of an overlap, so either secret alone suffices.
        for (String secret : secrets.split(",")) {
            if (!secret.isEmpty()) {
                webhooks.add(new Webhook(secret));
            }
        }
    }

    // Returns normally when one of the secrets signed the body; throws otherwise.
    void verify(String body, Map<String, List<String>> headers) throws WebhookVerificationException {
        WebhookVerificationException error = new WebhookVerificationException("no secret configured");
        for (Webhook webhook : webhooks) {
            try {
                webhook.verify(body, headers);
                return;
            } catch (WebhookVerificationException e) {
                error = e;
            }
        }
        throw error;
    }

    void handle(HttpExchange exchange) throws IOException {
        try (exchange) {
            if (!exchange.getRequestMethod().equals("POST")) {
                exchange.sendResponseHeaders(405, -1);
                return;
            }
            // The signature covers the raw bytes; the library takes them as a string.
            String body = new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
            try {
                verify(body, exchange.getRequestHeaders());
            } catch (WebhookVerificationException e) {
                System.out.println("rejected " + e.getMessage());
                exchange.sendResponseHeaders(401, -1);
                return;
            }
            JsonNode event = JSON.readTree(body);
            String type = event.path("type").asText();
            String id = exchange.getRequestHeaders().getFirst("webhook-id");
            // Herald's endpoint verification (an endpoint with spec.verify): echo the
            // challenge. Its webhook-id is fresh each time, so it needs no deduplication.
            if (type.equals("herald.endpoint.verification")) {
                System.out.println("challenge " + id);
                byte[] answer = JSON.writeValueAsBytes(
                        Map.of("challenge", event.path("data").path("challenge").asText()));
                exchange.getResponseHeaders().set("content-type", "application/json");
                exchange.sendResponseHeaders(200, answer.length);
                exchange.getResponseBody().write(answer);
                return;
            }
            if (!SEEN.add(exchange.getRequestURI().getPath() + " " + id)) {
                System.out.println("duplicate " + id);
                exchange.sendResponseHeaders(204, -1);
                return;
            }
            System.out.println("processed " + id + " " + type);
            exchange.sendResponseHeaders(204, -1);
        }
    }

    public static void main(String[] args) throws Exception {
        int port = 9004;
        for (int i = 0; i + 1 < args.length; i++) {
            if (args[i].equals("--port")) {
                port = Integer.parseInt(args[i + 1]);
            }
        }
        Receiver receiver = new Receiver(System.getenv().getOrDefault("WEBHOOK_SECRET", ""));
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 0);
        server.createContext("/", receiver::handle);
        server.setExecutor(Executors.newFixedThreadPool(4));
        server.start();
        System.out.println("listening on http://127.0.0.1:" + port);
    }
}
