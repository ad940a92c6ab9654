//! The direct path: the policy on the URL and at connect time (DNS rebinding), and what
//! the attempt log keeps of real answers.

use super::*;

fn fields(pointers: &[&str]) -> Vec<String> {
    pointers.iter().map(|p| (*p).to_owned()).collect()
}

/// Refused before any connection: the policy is checked on the URL itself.
#[tokio::test]
async fn a_url_the_policy_refuses_is_not_sent() {
    crate::install_crypto_provider();
    let policy = Arc::new(AddressPolicy::default());
    let http = client(policy.clone());
    let keys = [SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()];
    for (url, outcome, says) in [
        (
            "http://hooks.example.com/",
            Outcome::AddressForbidden,
            "scheme",
        ),
        (
            "https://user:pw@hooks.example.com/",
            Outcome::AddressForbidden,
            "credentials",
        ),
        ("https://10.0.0.1/", Outcome::AddressForbidden, "private"),
        ("https://[::a00:1]/", Outcome::AddressForbidden, "IPv4"),
        ("not a url", Outcome::RequestError, "invalid url"),
    ] {
        let attempt = Attempt {
            url,
            event_id: "msg_1",
            body: Bytes::from_static(b"{}"),
            keys: &keys,
            headers: &[],
            timeout: Duration::from_secs(1),
            redact_fields: &[],
            proxy: None,
            tls: None,
        };
        let result = send(&http, &policy, attempt).await;
        assert_eq!(result.outcome, outcome, "{url}");
        assert!(result.snippet.contains(says), "{url}: {}", result.snippet);
    }
}

/// DNS rebinding: the name answers an allowed address when it is checked and for the
/// first connection, then an internal one. The check at connect time refuses the
/// second connection; nothing reaches the internal receiver.
#[tokio::test]
async fn a_name_rebound_to_an_internal_address_is_refused_at_connect_time() {
    crate::install_crypto_provider();
    let (port, public, internal) = two_receivers().await;
    let policy = policy(&["127.0.0.1/32"]);
    let (lookup, calls) = scripted(vec![
        vec!["127.0.0.1"],
        vec!["127.0.0.1"],
        vec!["127.0.0.2"],
    ]);
    // What the operator does when it validates the endpoint: resolve, check.
    let validated = lookup("hooks.test".to_owned()).await.unwrap();
    assert_eq!(allowed_addresses(&policy, validated.clone()), Ok(validated));
    let http = client_with_lookup(policy.clone(), lookup);

    let first = post(&http, &policy, port).await;
    assert_eq!(first.outcome, Outcome::Success, "{}", first.snippet);
    let second = post(&http, &policy, port).await;
    assert_eq!(
        second.outcome,
        Outcome::AddressForbidden,
        "{}",
        second.snippet
    );
    assert!(second.snippet.contains("127.0.0.2"), "{}", second.snippet);
    assert!(second.snippet.contains("loopback"), "{}", second.snippet);
    assert_eq!(count(&calls), 3, "every connection resolves the name again");
    assert_eq!(count(&public), 1);
    assert_eq!(count(&internal), 0, "the rebound address was connected to");
}

/// A name with several addresses, the refused one first: only the allowed one is
/// connected to, every time.
#[tokio::test]
async fn a_name_with_one_internal_address_among_several_connects_to_the_others() {
    crate::install_crypto_provider();
    let (port, public, internal) = two_receivers().await;
    let policy = policy(&["127.0.0.1/32"]);
    let (lookup, _) = scripted(vec![vec!["127.0.0.2", "127.0.0.1"]]);
    let http = client_with_lookup(policy.clone(), lookup);
    for _ in 0..3 {
        let result = post(&http, &policy, port).await;
        assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
    }
    assert_eq!(count(&public), 3);
    assert_eq!(count(&internal), 0, "the refused address was connected to");
}

/// The allowlist opens exactly its range: 127.0.0.2/32 allowed reaches 127.0.0.2,
/// and its neighbour 127.0.0.1 stays refused.
#[tokio::test]
async fn an_allowlisted_range_is_reached_and_its_neighbours_are_not() {
    crate::install_crypto_provider();
    let (port, neighbour, allowlisted) = two_receivers().await;
    let policy = policy(&["127.0.0.2/32"]);
    let (lookup, _) = scripted(vec![vec!["127.0.0.2"], vec!["127.0.0.1"]]);
    let http = client_with_lookup(policy.clone(), lookup);
    let allowed = post(&http, &policy, port).await;
    assert_eq!(allowed.outcome, Outcome::Success, "{}", allowed.snippet);
    let refused = post(&http, &policy, port).await;
    assert_eq!(
        refused.outcome,
        Outcome::AddressForbidden,
        "{}",
        refused.snippet
    );
    assert_eq!(count(&allowlisted), 1);
    assert_eq!(count(&neighbour), 0);
}

/// A receiver on loopback that answers `body` (with a `content-length`) to every
/// request.
async fn answering(body: Vec<u8>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = Arc::new(body);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            });
        }
    });
    port
}

async fn send_to(port: u16, redact_fields: &[String]) -> AttemptResult {
    crate::install_crypto_provider();
    let policy = Arc::new(AddressPolicy::loopback_for_tests());
    let http = client(policy.clone());
    let keys = test_keys();
    let url = format!("http://127.0.0.1:{port}/");
    let attempt = Attempt {
        redact_fields,
        ..attempt_to(&url, &keys)
    };
    send(&http, &policy, attempt).await
}

/// Over a real connection: a JSON answer larger than the snippet (but within the read
/// limit) is parsed whole and redacted; one over the read limit is not kept.
#[tokio::test]
async fn responses_are_redacted_whole_or_not_kept() {
    let with = fields(&["/user/token"]);
    // Bigger than the snippet and its look-ahead: it has to be read whole to parse.
    let within = serde_json::json!({
        "user": {"token": "t-123", "id": 7},
        "zpadding": "p".repeat(20 * 1024),
    });
    let port = answering(within.to_string().into_bytes()).await;
    let result = send_to(port, &with).await;
    assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
    assert_eq!(result.snippet.len(), SNIPPET_BYTES);
    assert!(
        result
            .snippet
            .starts_with(r#"{"user":{"id":7,"token":"[redacted]"},"zpadding":"ppp"#),
        "{}",
        result.snippet
    );

    let over = serde_json::json!({
        "user": {"token": "t-123"},
        "zpadding": "p".repeat(MAX_BODY_READ),
    });
    let port = answering(over.to_string().into_bytes()).await;
    let result = send_to(port, &with).await;
    assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
    assert_eq!(result.snippet, NOT_KEPT);
    // Without fields, the same answer keeps its first kilobyte as before.
    let result = send_to(port, &[]).await;
    assert!(result.snippet.contains("t-123"), "{}", result.snippet);
}

/// A receiver that echoes the request head back (as debugging receivers do): the
/// attempt log gets the echo with the credentials redacted.
#[tokio::test]
async fn an_echoed_request_is_logged_without_its_credentials() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    crate::install_crypto_provider();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let body = head;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.write_all(&body).await;
        }
    });
    let policy = Arc::new(AddressPolicy::loopback_for_tests());
    let http = client(policy.clone());
    let keys = [SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()];
    let token = "Bearer 0123456789abcdef0123456789abcdef";
    let headers = [
        Header::literal("Authorization", token),
        Header::literal("X-Tenant", "shop"),
    ];
    let url = format!("http://127.0.0.1:{port}/");
    let attempt = Attempt {
        headers: &headers,
        ..attempt_to(&url, &keys)
    };
    let result = send(&http, &policy, attempt).await;
    assert_eq!(result.outcome, Outcome::Success, "{}", result.snippet);
    // What was sent, as the log keeps it: the signature cut to its version, the
    // credential redacted, the rest as sent.
    let sent: Vec<(&str, &str)> = result
        .request_headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    assert!(
        sent.contains(&("webhook-signature", "v1,[redacted]")),
        "{sent:?}"
    );
    assert!(sent.contains(&("Authorization", "[redacted]")), "{sent:?}");
    assert!(sent.contains(&("X-Tenant", "shop")), "{sent:?}");
    assert!(sent.contains(&("webhook-id", "msg_1")), "{sent:?}");
    assert!(
        sent.iter()
            .any(|(n, v)| *n == "user-agent" && v.starts_with("Herald/")),
        "{sent:?}"
    );
    // And what came back.
    assert!(
        result
            .response_headers
            .contains(&("connection".to_owned(), "close".to_owned())),
        "{:?}",
        result.response_headers
    );
    let snippet = &result.snippet;
    assert!(snippet.len() <= SNIPPET_BYTES);
    assert!(
        snippet.contains("webhook-signature: [redacted]"),
        "{snippet}"
    );
    assert!(snippet.contains("authorization: [redacted]"), "{snippet}");
    assert!(snippet.contains("x-tenant: shop"), "{snippet}");
    // No piece of the token either, however the snippet was cut.
    assert!(!snippet.contains("0123456789abcdef"), "{snippet}");
    assert!(!snippet.contains("v1,"), "{snippet}");
}
