//! Command-line flags both binaries share (clap argument groups, flattened into each
//! binary's own settings), so the NATS connection and the destination policy are set
//! the same way everywhere.
//!
//! NATS credentials never leave this module in the clear: a password in `--nats-url` is
//! taken out of the URL before async-nats sees it (its debug logs print server
//! addresses), `Debug` and every error print the URL redacted, `--help` hides the
//! environment's value, and secrets (NKey seed, credentials, TLS key) are only ever read
//! from files, never passed on the command line.

use std::path::{Path, PathBuf};

use clap::Args;
use ipnet::IpNet;

use crate::ssrf::AddressPolicy;

/// How to reach NATS JetStream, as whom, and how many replicas Herald's streams get.
#[derive(Args, Clone)]
pub struct NatsArgs {
    /// NATS server URL(s), comma-separated (`tls://` to require TLS). A user and
    /// password in a URL are used to log in and are never printed.
    #[arg(
        long,
        env = "HERALD_NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        hide_env_values = true
    )]
    pub nats_url: String,

    /// PEM file of the CA certificate(s) that sign the NATS servers' certificates
    /// (instead of the system's roots); TLS is then required.
    #[arg(long, env = "HERALD_NATS_TLS_CA", value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,

    /// PEM file of this client's certificate, for servers that verify clients
    /// (`verify` or `verify_and_map`); needs `--nats-tls-key`. TLS is then required.
    #[arg(
        long,
        env = "HERALD_NATS_TLS_CERT",
        value_name = "FILE",
        requires = "nats_tls_key"
    )]
    pub nats_tls_cert: Option<PathBuf>,

    /// PEM file of the private key of `--nats-tls-cert`.
    #[arg(
        long,
        env = "HERALD_NATS_TLS_KEY",
        value_name = "FILE",
        requires = "nats_tls_cert"
    )]
    pub nats_tls_key: Option<PathBuf>,

    /// NATS credentials file (a user JWT and its NKey seed, as `nsc` writes them), for
    /// servers in operator (JWT) mode.
    #[arg(
        long,
        env = "HERALD_NATS_CREDS",
        value_name = "FILE",
        conflicts_with = "nats_nkey"
    )]
    pub nats_creds: Option<PathBuf>,

    /// File holding this client's NKey seed (`SU...`), for servers that list users by
    /// NKey. The seed is read from the file, never given on the command line.
    #[arg(long, env = "HERALD_NATS_NKEY", value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,

    /// JetStream replicas of every stream and bucket Herald creates (1 on a single
    /// server, 3 in a production cluster). Existing streams are raised to this, never
    /// lowered.
    #[arg(long = "jetstream-replicas", env = "HERALD_JETSTREAM_REPLICAS", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=5))]
    pub replicas: u8,
}

impl std::fmt::Debug for NatsArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            nats_url,
            nats_tls_ca,
            nats_tls_cert,
            nats_tls_key,
            nats_creds,
            nats_nkey,
            replicas,
        } = self;
        f.debug_struct("NatsArgs")
            .field("nats_url", &redact_urls(nats_url))
            .field("nats_tls_ca", nats_tls_ca)
            .field("nats_tls_cert", nats_tls_cert)
            .field("nats_tls_key", nats_tls_key)
            .field("nats_creds", nats_creds)
            .field("nats_nkey", nats_nkey)
            .field("replicas", replicas)
            .finish()
    }
}

/// `urls` (a comma-separated list) with every password replaced by `***`, for messages.
pub fn redact_urls(urls: &str) -> String {
    urls.split(',')
        .map(|u| match url::Url::parse(u.trim()) {
            Ok(mut parsed) if parsed.password().is_some() => {
                let _ = parsed.set_password(Some("***"));
                parsed.to_string()
            }
            Ok(_) => u.trim().to_owned(),
            // Unparsable: the part before an `@` may be a password.
            Err(_) => match u.rsplit_once('@') {
                Some((_, host)) => format!("***@{host}"),
                None => u.trim().to_owned(),
            },
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Why NATS could not be reached. Never contains a password, a seed or a key: URLs
/// are named by their position in the list, files by flag and path.
#[derive(Debug, thiserror::Error)]
pub enum NatsConnectError {
    #[error(
        "entry {position} of --nats-url (HERALD_NATS_URL) is not a NATS URL such as nats://host:4222"
    )]
    Url { position: usize },
    #[error("--nats-url (HERALD_NATS_URL) is empty")]
    Empty,
    #[error(
        "the URLs of --nats-url (HERALD_NATS_URL) carry different users or passwords; give all the same login"
    )]
    MixedLogins,
    #[error("{flag}: cannot use {}: {reason}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("connecting to NATS: {0}")]
    Connect(#[source] async_nats::ConnectError),
}

/// A URL's user and password, taken out of it.
type Login = Option<(String, String)>;

impl NatsArgs {
    /// The servers of `--nats-url`, a comma-separated list (async-nats takes one URL per
    /// address, so the list is split here, once for both binaries), without their
    /// user and password.
    pub fn server_addrs(&self) -> Result<Vec<async_nats::ServerAddr>, NatsConnectError> {
        Ok(self.servers_and_login()?.0)
    }

    /// The servers and the one login (user and password) their URLs carry, if any. The
    /// login is passed to async-nats apart from the addresses, so no address it may log
    /// holds a password.
    fn servers_and_login(&self) -> Result<(Vec<async_nats::ServerAddr>, Login), NatsConnectError> {
        let mut login: Option<Login> = None;
        let mut addrs = Vec::new();
        let entries = self
            .nats_url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty());
        for (i, entry) in entries.enumerate() {
            let bad = || NatsConnectError::Url { position: i + 1 };
            let addr = entry.parse::<async_nats::ServerAddr>().map_err(|_| bad())?;
            let mut url = addr.into_inner();
            let this: Login = (!url.username().is_empty()).then(|| {
                let user = percent_decode(url.username());
                let password = percent_decode(url.password().unwrap_or_default());
                (user, password)
            });
            if url.set_username("").is_err() || url.set_password(None).is_err() {
                return Err(bad());
            }
            match &login {
                None => login = Some(this),
                Some(seen) if *seen == this => {}
                Some(_) => return Err(NatsConnectError::MixedLogins),
            }
            addrs.push(async_nats::ServerAddr::from_url(url).map_err(|_| bad())?);
        }
        if addrs.is_empty() {
            return Err(NatsConnectError::Empty);
        }
        Ok((addrs, login.flatten()))
    }

    /// The connection options these flags describe, with every file checked now (a
    /// missing or unreadable file is an error naming the flag, not an endless silent
    /// reconnect loop).
    pub async fn options(
        &self,
        name: &str,
    ) -> Result<async_nats::ConnectOptions, NatsConnectError> {
        let (_, login) = self.servers_and_login()?;
        let mut options = async_nats::ConnectOptions::new().name(name);
        if let Some((user, password)) = login {
            options = options.user_and_password(user, password);
        }
        let mut tls = false;
        if let Some(ca) = &self.nats_tls_ca {
            pem_file("--nats-tls-ca", ca, "CERTIFICATE")?;
            options = options.add_root_certificates(ca.clone());
            tls = true;
        }
        if let (Some(cert), Some(key)) = (&self.nats_tls_cert, &self.nats_tls_key) {
            pem_file("--nats-tls-cert", cert, "CERTIFICATE")?;
            pem_file("--nats-tls-key", key, "PRIVATE KEY")?;
            options = options.add_client_certificate(cert.clone(), key.clone());
            tls = true;
        }
        if tls {
            options = options.require_tls(true);
        }
        if let Some(creds) = &self.nats_creds {
            options = options
                .credentials_file(creds)
                .await
                // async-nats's message names the file and what is wrong with it,
                // never its content.
                .map_err(|e| file_error("--nats-creds", creds, e.to_string()))?;
        }
        if let Some(path) = &self.nats_nkey {
            options = options.nkey(nkey_seed(path)?);
        }
        Ok(options)
    }

    /// Connects as `name`, retrying the initial connection (NATS may start after
    /// Herald, or be restarting) and reconnecting for ever.
    pub async fn connect(&self, name: &str) -> Result<async_nats::Client, NatsConnectError> {
        let addrs = self.server_addrs()?;
        self.options(name)
            .await?
            .retry_on_initial_connect()
            .connect(addrs)
            .await
            .map_err(NatsConnectError::Connect)
    }
}

fn file_error(flag: &'static str, path: &Path, reason: String) -> NatsConnectError {
    NatsConnectError::File {
        flag,
        path: path.to_owned(),
        reason,
    }
}

/// Checks that `path` is a readable PEM file with a block whose label ends in `label`
/// (`CERTIFICATE`; `PRIVATE KEY` matches PKCS#8, RSA and EC keys).
fn pem_file(flag: &'static str, path: &Path, label: &str) -> Result<(), NatsConnectError> {
    let text = std::fs::read_to_string(path).map_err(|e| file_error(flag, path, e.to_string()))?;
    let has_block = text.lines().any(|line| {
        line.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|l| l.ends_with(label))
    });
    if has_block {
        Ok(())
    } else {
        Err(file_error(flag, path, format!("no PEM {label} in it")))
    }
}

/// The NKey seed in `path`: one line, a user seed (`SU` + 56 base32 characters). The
/// error never quotes the file.
fn nkey_seed(path: &Path) -> Result<String, NatsConnectError> {
    let flag = "--nats-nkey";
    let text = std::fs::read_to_string(path).map_err(|e| file_error(flag, path, e.to_string()))?;
    let seed = text.trim();
    let plausible = seed.len() == 58
        && seed.starts_with("SU")
        && seed
            .bytes()
            .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b));
    if plausible {
        Ok(seed.to_owned())
    } else {
        Err(file_error(
            flag,
            path,
            "not an NKey user seed (one line starting with SU, as `nk -gen user` writes)".into(),
        ))
    }
}

/// `%XX` escapes of a URL's user or password decoded (a password may hold `@` or `:`).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Which destinations webhook URLs may use beyond the public internet over https.
#[derive(Args, Clone, Debug, Default)]
pub struct AddressPolicyArgs {
    /// Networks endpoint URLs may point at although they are loopback, private or
    /// link-local (comma-separated CIDRs, e.g. `10.20.0.0/16`).
    #[arg(
        long = "allow-network",
        env = "HERALD_ALLOW_NETWORKS",
        value_delimiter = ','
    )]
    pub allow_networks: Vec<IpNet>,

    /// Allow plain `http://` endpoint URLs.
    #[arg(long, env = "HERALD_ALLOW_HTTP")]
    pub allow_http: bool,
}

impl AddressPolicyArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> AddressPolicy {
        AddressPolicy {
            allow: self.allow_networks.clone(),
            allow_http: self.allow_http,
        }
    }

    /// Loopback allowed over http: what the tests run with.
    pub fn loopback_for_tests() -> Self {
        Self {
            allow_networks: AddressPolicy::loopback_for_tests().allow,
            allow_http: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Both {
        #[command(flatten)]
        nats: NatsArgs,
        #[command(flatten)]
        policy: AddressPolicyArgs,
    }

    #[test]
    fn flags_parse_with_their_defaults() {
        let both = Both::try_parse_from(["x"]).unwrap();
        assert_eq!(both.nats.replicas, 1);
        assert!(!both.policy.allow_http);
        let both = Both::try_parse_from([
            "x",
            "--jetstream-replicas",
            "3",
            "--allow-network",
            "10.0.0.0/8,127.0.0.0/8",
            "--allow-http",
        ])
        .unwrap();
        assert_eq!(both.nats.replicas, 3);
        assert_eq!(both.policy.policy().allow.len(), 2);
        assert!(Both::try_parse_from(["x", "--jetstream-replicas", "0"]).is_err());
        assert!(Both::try_parse_from(["x", "--allow-network", "nope"]).is_err());
    }

    #[test]
    fn nats_urls_are_a_comma_separated_list_and_errors_hide_them() {
        let parse = |url: &str| Both::try_parse_from(["x", "--nats-url", url]).unwrap().nats;
        let three = parse("nats://127.0.0.1:4222, nats://127.0.0.1:4223,nats://127.0.0.1:4224");
        assert_eq!(three.server_addrs().unwrap().len(), 3);
        let bad = parse("nats://u:secret@127.0.0.1:4222,nats://[::1:4223");
        let error = bad.server_addrs().unwrap_err().to_string();
        assert!(error.contains("entry 2"), "{error}");
        assert!(!error.contains("secret"), "{error}");
        assert!(parse(" , ").server_addrs().is_err());
    }
    #[test]
    fn a_password_is_taken_out_of_the_urls_and_never_printed() {
        let parse = |url: &str| Both::try_parse_from(["x", "--nats-url", url]).unwrap().nats;
        let args = parse("nats://herald:s%40cret@127.0.0.1:4222,tls://herald:s%40cret@[::1]:4223");
        let (addrs, login) = args.servers_and_login().unwrap();
        assert_eq!(login, Some(("herald".into(), "s@cret".into())));
        for addr in &addrs {
            assert!(!addr.has_user_pass(), "{addr:?}");
            assert!(!format!("{addr:?}").contains("cret"), "{addr:?}");
        }
        let debug = format!("{args:?}");
        assert!(!debug.contains("cret"), "{debug}");
        assert!(debug.contains("***@127.0.0.1"), "{debug}");
        let mixed = parse("nats://a:pw1@127.0.0.1:4222,nats://a:pw2@127.0.0.1:4223");
        let error = mixed.server_addrs().unwrap_err().to_string();
        assert!(!error.contains("pw1") && !error.contains("pw2"), "{error}");
        assert_eq!(
            redact_urls("nats://u:p@h:1, nats://h:2"),
            "nats://u:***@h:1,nats://h:2"
        );
        assert_eq!(redact_urls("nats://u:p@[::1"), "***@[::1");
    }

    #[tokio::test]
    async fn secret_files_are_checked_and_never_quoted() {
        let dir = std::env::temp_dir().join(format!("herald-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let seed = dir.join("seed");
        let secret = "SUNOTAVALIDSEEDBUTSECRETSECRETSECRET";
        std::fs::write(&seed, secret).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let key = dir.join("key.pem");
        std::fs::write(&key, "not a key but SECRET").unwrap();
        let parse = |args: &[&str]| {
            Both::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
                .unwrap()
                .nats
        };
        let nkey = parse(&["--nats-nkey", seed.to_str().unwrap()]);
        let error = nkey.options("t").await.unwrap_err().to_string();
        assert!(error.starts_with("--nats-nkey"), "{error}");
        assert!(!error.contains("SECRET"), "{error}");
        let tls = parse(&[
            "--nats-tls-ca",
            ca.to_str().unwrap(),
            "--nats-tls-cert",
            ca.to_str().unwrap(),
            "--nats-tls-key",
            key.to_str().unwrap(),
        ]);
        let error = tls.options("t").await.unwrap_err().to_string();
        assert!(error.starts_with("--nats-tls-key"), "{error}");
        assert!(!error.contains("SECRET"), "{error}");
        let creds = parse(&["--nats-creds", key.to_str().unwrap()]);
        let error = creds.options("t").await.unwrap_err().to_string();
        assert!(error.starts_with("--nats-creds"), "{error}");
        assert!(!error.contains("SECRET"), "{error}");
        let missing = parse(&["--nats-tls-ca", "/nonexistent/ca.pem"]);
        let error = missing.options("t").await.unwrap_err().to_string();
        assert!(error.contains("/nonexistent/ca.pem"), "{error}");
        // A certificate without its key, or credentials with a seed, are refused by clap.
        assert!(Both::try_parse_from(["x", "--nats-tls-cert", "c"]).is_err());
        assert!(Both::try_parse_from(["x", "--nats-creds", "c", "--nats-nkey", "k"]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
