// A Herald webhook receiver in Go, verifying with the official Standard Webhooks library
// (github.com/standard-webhooks/standard-webhooks/libraries/go).
//
//	WEBHOOK_SECRET=whsec_... go run . --port 9002
//
// Answers 204 for a valid signature, also for a duplicate (delivery is at-least-once: a
// retry, a replay or a redelivery after a dispatcher restart carries the same webhook-id),
// which is then not processed again; 401 for a bad signature or a timestamp more than 5
// minutes away. Prints `processed <webhook-id> <type>` or `duplicate <webhook-id>` per
// request.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"sync"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// How many webhook-ids the receiver remembers. A real receiver keeps them in its database
// (for longer than Herald retries and replays: days), in the same transaction as the
// effect of the event; memory is enough for an example.
const remembered = 10000

// seen is a bounded set of keys, the path and the webhook-id: the oldest is forgotten
// first. The path is in the key because Herald sends an event to each of a namespace's
// endpoints that match it with the same webhook-id: a receiver serving several endpoints
// (one path each) processes it once per endpoint.
type seen struct {
	mu    sync.Mutex
	ids   map[string]struct{}
	order []string
}

// firstTime records key and says whether it is new. Checking and recording under one
// lock: two concurrent deliveries of one event (a retry racing a slow first attempt)
// must not both be processed.
func (s *seen) firstTime(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ids[key]; ok {
		return false
	}
	s.ids[key] = struct{}{}
	s.order = append(s.order, key)
	if len(s.order) > remembered {
		delete(s.ids, s.order[0])
		s.order = s.order[1:]
	}
	return true
}

type event struct {
	Type string `json:"type"`
	Data struct {
		Challenge string `json:"challenge"`
	} `json:"data"`
}

// verify returns nil when one of the webhooks (one per secret: two while a key rotation
// overlaps) verifies the request. Herald signs with every key of an overlap, so either
// secret alone suffices.
func verify(webhooks []*standardwebhooks.Webhook, body []byte, headers http.Header) error {
	err := errors.New("no secret configured")
	for _, wh := range webhooks {
		if err = wh.Verify(body, headers); err == nil {
			return nil
		}
	}
	return err
}

func main() {
	port := flag.Int("port", 9002, "port to listen on (127.0.0.1)")
	flag.Parse()
	var webhooks []*standardwebhooks.Webhook
	for _, secret := range strings.Split(os.Getenv("WEBHOOK_SECRET"), ",") {
		if secret == "" {
			continue
		}
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			log.Fatalf("WEBHOOK_SECRET: %v", err)
		}
		webhooks = append(webhooks, wh)
	}
	ids := &seen{ids: map[string]struct{}{}}

	http.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		// The signature covers the raw bytes: verify them before decoding anything.
		// Read at most 1 MiB (Herald's events are at most 256 KiB unless its operator
		// raised the limit): anyone can POST, before the signature is checked.
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if err := verify(webhooks, body, r.Header); err != nil {
			fmt.Printf("rejected %v\n", err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev event
		if err := json.Unmarshal(body, &ev); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		id := r.Header.Get("webhook-id")
		// Herald's endpoint verification (an endpoint with spec.verify): echo the
		// challenge. Its webhook-id is fresh each time, so it needs no deduplication.
		if ev.Type == "herald.endpoint.verification" {
			fmt.Printf("challenge %s\n", id)
			w.Header().Set("content-type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]string{"challenge": ev.Data.Challenge})
			return
		}
		if !ids.firstTime(r.URL.Path + " " + id) {
			fmt.Printf("duplicate %s\n", id)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		fmt.Printf("processed %s %s\n", id, ev.Type)
		w.WriteHeader(http.StatusNoContent)
	})

	addr := fmt.Sprintf("127.0.0.1:%d", *port)
	fmt.Printf("listening on http://%s\n", addr)
	log.Fatal(http.ListenAndServe(addr, nil))
}
