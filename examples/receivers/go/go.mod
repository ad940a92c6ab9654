module herald.dev/examples/receivers/go

go 1.22

require github.com/standard-webhooks/standard-webhooks/libraries v1.3.0
