//! Clients for endpoints with TLS material of their own (`spec.tls`): a client
//! certificate to present (mutual TLS) and a CA to verify the receiver with instead of
//! the platform's roots.
//!
//! Contract: one pooled client per distinct material and way out (direct, or each egress
//! proxy), built on first use and kept, so connections are reused per endpoint identity
//! and never carry one tenant's certificate to another's receiver. The table is bounded
//! ([`MAX_CLIENTS`]): past it, it is emptied and rebuilt as attempts come (a renewed
//! certificate is new material, the old client ages out that way).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use herald_core::dataplane::TlsMaterial;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::connect::DirectConnector;
use super::tunnel::TunnelConnector;
use super::{Pooled, pooled};

/// Most clients kept at once.
pub const MAX_CLIENTS: usize = 4096;

/// Clients by key, built on first use.
type Table<K, C> = Arc<Mutex<HashMap<K, Pooled<C>>>>;

/// The clients of endpoints with their own TLS material: by material, and by proxy
/// name and material. Cheap to clone.
#[derive(Clone, Default)]
pub(super) struct EndpointClients {
    direct: Table<u64, DirectConnector>,
    proxied: Table<(String, u64), TunnelConnector>,
}

fn fingerprint(material: &TlsMaterial) -> u64 {
    let mut hasher = DefaultHasher::new();
    material.hash(&mut hasher);
    hasher.finish()
}

/// Gets or builds the client of `key` in `table`.
fn get_or_build<K: Eq + Hash, C: Clone>(
    table: &Mutex<HashMap<K, C>>,
    key: K,
    build: impl FnOnce() -> Result<C, String>,
) -> Result<C, String> {
    let mut table = table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(client) = table.get(&key) {
        return Ok(client.clone());
    }
    let client = build()?;
    if table.len() >= MAX_CLIENTS {
        table.clear();
    }
    table.insert(key, client.clone());
    Ok(client)
}

impl EndpointClients {
    /// The direct client for `material`, over `connector`.
    pub(super) fn direct(
        &self,
        material: &TlsMaterial,
        connector: &DirectConnector,
        idle_per_host: usize,
    ) -> Result<Pooled<DirectConnector>, String> {
        get_or_build(&self.direct, fingerprint(material), || {
            Ok(pooled(connector.clone(), &config(material)?, idle_per_host))
        })
    }

    /// The client for `material` through the proxy `name`, over `connector`.
    pub(super) fn proxied(
        &self,
        material: &TlsMaterial,
        name: &str,
        connector: &TunnelConnector,
        idle_per_host: usize,
    ) -> Result<Pooled<TunnelConnector>, String> {
        let key = (name.to_owned(), fingerprint(material));
        get_or_build(&self.proxied, key, || {
            Ok(pooled(connector.clone(), &config(material)?, idle_per_host))
        })
    }
}

/// The rustls configuration of `material`: its CA or the platform's roots, and its
/// client certificate if it has one. Errors say what is wrong, never the key.
pub fn config(material: &TlsMaterial) -> Result<rustls::ClientConfig, String> {
    let builder = rustls::ClientConfig::builder();
    let builder = match &material.ca {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| format!("spec.tls.ca: not PEM certificates ({e})"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("spec.tls.ca: unusable certificate ({e})"))?;
            }
            builder.with_root_certificates(roots)
        }
        None => {
            use rustls_platform_verifier::BuilderVerifierExt;
            builder
                .with_platform_verifier()
                .map_err(|e| format!("loading the platform's TLS roots: {e}"))?
        }
    };
    match (&material.client_cert, &material.client_key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("spec.tls.clientCertificate tls.crt: not PEM ({e})"))?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|_| {
                "spec.tls.clientCertificate tls.key: not a PEM private key".to_owned()
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("spec.tls.clientCertificate: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}
