//! Is NATS one Herald can run on, and are Herald's streams as the installation needs
//! them? The server is judged by the same rule the dispatcher and the operator refuse
//! an unfit server with at start (`herald_core::dataplane::layout::check_server_info`:
//! nats-server 2.12 or newer, `max_payload` room for the largest event with its lane
//! headers) after JetStream answered for the account. Each stream must exist, be
//! file-backed, have at least the installation's JetStream replicas with a leader and
//! no replica offline, carry Herald's largest message (`max_msg_size`), and the lanes'
//! stream must allow per-message schedules (retries). Pure: the facts are passed in.

use herald_core::dataplane::layout::{self, LayoutError};

use super::report::Verdict;

/// What the server announced and whether JetStream answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerFacts {
    pub version: String,
    pub max_payload: usize,
    pub jetstream: Result<(), JetStream>,
}

/// Why JetStream did not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JetStream {
    /// Off for the server or the account.
    Disabled,
    /// The question failed (a timeout, a permission).
    Unanswered(String),
}

/// The verdict on the server: `facts` is `Err` when no connection could be made;
/// `max_event_bytes` is the dispatchers' `--max-event-bytes`.
pub fn server_verdict(facts: &Result<ServerFacts, String>, max_event_bytes: usize) -> Verdict {
    const CHECK: &str = "nats";
    let facts = match facts {
        Err(error) => {
            return Verdict::fail(
                CHECK,
                format!(
                    "{error}: check --nats-url (HERALD_NATS_URL) and the credentials flags; from a workstation, port-forward NATS first (kubectl port-forward -n NAMESPACE svc/nats 4222) and use --nats-url nats://127.0.0.1:4222"
                ),
            );
        }
        Ok(facts) => facts,
    };
    match &facts.jetstream {
        Err(JetStream::Disabled) => {
            return Verdict::fail(CHECK, LayoutError::NoJetStream.to_string());
        }
        Err(JetStream::Unanswered(error)) => {
            return Verdict::fail(
                CHECK,
                format!(
                    "nats-server {} answers, but JetStream does not: {error}",
                    facts.version
                ),
            );
        }
        Ok(()) => {}
    }
    let needed = max_event_bytes + layout::LANE_HEADER_ROOM;
    if let Err(error) = layout::check_server_info(&facts.version, facts.max_payload, needed) {
        return Verdict::fail(CHECK, error.to_string());
    }
    Verdict::ok(
        CHECK,
        format!(
            "nats-server {}, JetStream enabled, max_payload {} (Herald needs {needed}: --max-event-bytes {max_event_bytes} and the headers of a lane message)",
            facts.version,
            bytes(facts.max_payload as i64)
        ),
    )
}

/// A stream's configuration and state, as far as Herald cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamFacts {
    pub replicas: usize,
    pub file: bool,
    /// `max_msg_size`; -1 (or 0) is no limit beyond the server's `max_payload`.
    pub max_message_size: i64,
    pub schedules: bool,
    /// In a cluster: the leader's server name, `None` while there is none.
    pub leader: Option<String>,
    /// In a cluster: whether the stream has a cluster record at all (a single server
    /// may give none).
    pub clustered: bool,
    /// Replicas the group considers offline.
    pub offline: Vec<String>,
    pub messages: u64,
}

/// What the installation asks of its streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// `--jetstream-replicas`.
    pub replicas: usize,
    /// The dispatchers' `--max-event-bytes`.
    pub max_event_bytes: usize,
}

/// The verdict on stream `spec` (`facts`: `None` when it does not exist).
pub fn stream_verdict(
    spec: &layout::StreamSpec,
    facts: &Result<Option<StreamFacts>, String>,
    wanted: Wanted,
) -> Verdict {
    let name = spec.name;
    let check = format!("stream/{name}");
    let facts = match facts {
        Err(error) => return Verdict::fail(check, format!("cannot read the stream: {error}")),
        Ok(None) => {
            return Verdict::fail(
                check,
                "does not exist: the dispatchers create it when they start, so none has started against this NATS (or it was deleted): start or restart the dispatchers",
            );
        }
        Ok(Some(facts)) => facts,
    };
    if !facts.file {
        return Verdict::fail(
            check,
            "is kept in memory (a NATS restart loses every event in it): back it up (nats stream backup), delete it and restart a dispatcher, which creates it with file storage",
        );
    }
    if facts.replicas < wanted.replicas {
        return Verdict::fail(
            check,
            format!(
                "has {} replica{}, the installation asks for {} (--jetstream-replicas, the chart's nats.jetstreamReplicas): restart a dispatcher (it raises them) or `nats stream edit {name} --replicas {}`",
                facts.replicas,
                if facts.replicas == 1 { "" } else { "s" },
                wanted.replicas,
                wanted.replicas
            ),
        );
    }
    if facts.clustered && facts.leader.is_none() {
        return Verdict::fail(
            check,
            "has no leader: no event can be written to or read from it until the NATS cluster elects one (check the NATS servers: nats server report jetstream)",
        );
    }
    if !facts.offline.is_empty() {
        return Verdict::fail(
            check,
            format!(
                "replica{} {} offline: one more lost node can stop it; bring the NATS server{} back",
                if facts.offline.len() == 1 { "" } else { "s" },
                facts.offline.join(", "),
                if facts.offline.len() == 1 { "" } else { "s" },
            ),
        );
    }
    let largest = layout::largest_message(name, wanted.max_event_bytes).unwrap_or(0);
    if facts.max_message_size > 0 && (facts.max_message_size as usize) < largest {
        return Verdict::fail(
            check,
            format!(
                "takes messages of at most {} bytes (max_msg_size) but Herald writes up to {largest} here (--max-event-bytes {}): `nats stream edit {name} --max-msg-size=-1`, or lower --max-event-bytes (HERALD_MAX_EVENT_BYTES, the chart's dispatcher.maxEventBytes)",
                facts.max_message_size, wanted.max_event_bytes
            ),
        );
    }
    if spec.schedules && !facts.schedules {
        return Verdict::fail(
            check,
            "does not allow per-message schedules, which hold Herald's retries: restart a dispatcher (it turns them on) or `nats stream edit` with allow_msg_schedules",
        );
    }
    let limit = if facts.max_message_size > 0 {
        format!("messages up to {}", bytes(facts.max_message_size))
    } else {
        "no message size limit of its own".to_owned()
    };
    Verdict::ok(
        check,
        format!(
            "R{}, file, {limit}, {} message{}",
            facts.replicas,
            facts.messages,
            if facts.messages == 1 { "" } else { "s" }
        ),
    )
}

/// Bytes as a person reads them: `1 MiB`, `256 KiB`, `1000 B`.
fn bytes(n: i64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;
    use herald_core::dataplane::layout::{DEFAULT_RETENTION, streams};
    use herald_core::envelope::DEFAULT_MAX_EVENT_BYTES;

    fn server(version: &str, max_payload: usize) -> ServerFacts {
        ServerFacts {
            version: version.into(),
            max_payload,
            jetstream: Ok(()),
        }
    }

    #[test]
    fn a_fit_server_is_ok() {
        let v = server_verdict(&Ok(server("2.15.1", 1 << 20)), DEFAULT_MAX_EVENT_BYTES);
        assert_eq!(v.status, Status::Ok);
        assert_eq!(v.check, "nats");
        assert!(
            v.message.starts_with(
                "nats-server 2.15.1, JetStream enabled, max_payload 1 MiB (Herald needs 263168"
            ),
            "{v:?}"
        );
    }

    #[test]
    fn an_unfit_server_fails_with_the_binaries_own_message() {
        let old = server_verdict(&Ok(server("2.11.4", 1 << 20)), DEFAULT_MAX_EVENT_BYTES);
        assert_eq!(old.status, Status::Fail);
        assert!(
            old.message
                .contains("is too old: Herald needs 2.12 or newer"),
            "{old:?}"
        );
        let small = server_verdict(&Ok(server("2.12.0", 1 << 20)), 2_000_000);
        assert!(
            small
                .message
                .contains("max_payload is 1048576 bytes but Herald needs 2001024"),
            "{small:?}"
        );
        let off = ServerFacts {
            jetstream: Err(JetStream::Disabled),
            ..server("2.12.0", 1 << 20)
        };
        let v = server_verdict(&Ok(off), DEFAULT_MAX_EVENT_BYTES);
        assert!(v.message.starts_with("JetStream is not enabled"), "{v:?}");
        let refused = ServerFacts {
            jetstream: Err(JetStream::Unanswered("permissions violation".into())),
            ..server("2.12.0", 1 << 20)
        };
        let v = server_verdict(&Ok(refused), DEFAULT_MAX_EVENT_BYTES);
        assert_eq!(
            v.message,
            "nats-server 2.12.0 answers, but JetStream does not: permissions violation"
        );
        let down = server_verdict(&Err("connecting to NATS: refused".into()), 1);
        assert!(
            down.message
                .starts_with("connecting to NATS: refused: check --nats-url")
        );
    }

    fn healthy() -> StreamFacts {
        StreamFacts {
            replicas: 3,
            file: true,
            max_message_size: -1,
            schedules: true,
            leader: Some("n0".into()),
            clustered: true,
            offline: vec![],
            messages: 12,
        }
    }

    const WANTED: Wanted = Wanted {
        replicas: 3,
        max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
    };

    fn lanes() -> layout::StreamSpec {
        streams(DEFAULT_RETENTION, 4)[1].clone()
    }

    #[test]
    fn a_stream_as_herald_needs_it_is_ok() {
        for spec in streams(DEFAULT_RETENTION, 4) {
            let v = stream_verdict(&spec, &Ok(Some(healthy())), WANTED);
            assert_eq!(v.status, Status::Ok, "{v:?}");
            assert_eq!(v.check, format!("stream/{}", spec.name));
            assert_eq!(
                v.message,
                "R3, file, no message size limit of its own, 12 messages"
            );
        }
        let more = StreamFacts {
            replicas: 5,
            max_message_size: 1 << 20,
            ..healthy()
        };
        let v = stream_verdict(&lanes(), &Ok(Some(more)), WANTED);
        assert_eq!(v.message, "R5, file, messages up to 1 MiB, 12 messages");
        // A single server reports no cluster group: no leader is no fault there.
        let single = StreamFacts {
            replicas: 1,
            leader: None,
            clustered: false,
            ..healthy()
        };
        let v = stream_verdict(
            &lanes(),
            &Ok(Some(single)),
            Wanted {
                replicas: 1,
                ..WANTED
            },
        );
        assert_eq!(v.status, Status::Ok, "{v:?}");
    }

    #[test]
    fn each_fault_of_a_stream_says_what_to_change() {
        let cases: [(StreamFacts, &str); 6] = [
            (
                StreamFacts {
                    replicas: 1,
                    ..healthy()
                },
                "has 1 replica, the installation asks for 3 (--jetstream-replicas",
            ),
            (
                StreamFacts {
                    file: false,
                    ..healthy()
                },
                "is kept in memory",
            ),
            (
                StreamFacts {
                    leader: None,
                    ..healthy()
                },
                "has no leader",
            ),
            (
                StreamFacts {
                    offline: vec!["n2".into()],
                    ..healthy()
                },
                "replica n2 offline",
            ),
            (
                StreamFacts {
                    max_message_size: 1024,
                    ..healthy()
                },
                "takes messages of at most 1024 bytes (max_msg_size) but Herald writes up to 263168 here",
            ),
            (
                StreamFacts {
                    schedules: false,
                    ..healthy()
                },
                "does not allow per-message schedules",
            ),
        ];
        for (facts, expected) in cases {
            let v = stream_verdict(&lanes(), &Ok(Some(facts)), WANTED);
            assert_eq!(v.status, Status::Fail);
            assert!(v.message.starts_with(expected), "{expected}: {v:?}");
        }
        let v = stream_verdict(&lanes(), &Ok(None), WANTED);
        assert!(
            v.message
                .starts_with("does not exist: the dispatchers create it")
        );
        let v = stream_verdict(&lanes(), &Err("timed out".into()), WANTED);
        assert_eq!(v.message, "cannot read the stream: timed out");
        // Schedules matter only on the lanes' stream.
        let events = streams(DEFAULT_RETENTION, 4)[0].clone();
        let v = stream_verdict(
            &events,
            &Ok(Some(StreamFacts {
                schedules: false,
                ..healthy()
            })),
            WANTED,
        );
        assert_eq!(v.status, Status::Ok);
    }

    #[test]
    fn sizes_read_short() {
        assert_eq!(bytes(1 << 20), "1 MiB");
        assert_eq!(bytes(256 * 1024), "256 KiB");
        assert_eq!(bytes(1000), "1000 B");
    }
}
