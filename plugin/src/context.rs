//! The user's kubeconfig, the way kubectl reads it: `--kubeconfig` or `KUBECONFIG` or
//! `~/.kube/config`, `--context` or the current context, `-n` or the context's namespace.
//!
//! The same identity signs in to Herald's HTTP API: its bearer token, taken through
//! kube's own authentication layer ([`ConfigExt::auth_layer`]), so a static `token`, a
//! `tokenFile` (re-read as kubectl does) and an `exec` credential plugin (refreshed
//! before it expires) all work without this crate knowing how. Client certificates
//! cannot be sent to another server, so such an identity needs `--token`.

use std::path::PathBuf;

use http::header::AUTHORIZATION;
use kube::client::ConfigExt;
use kube::client::middleware::AuthLayer;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::{Layer, ServiceExt};

/// Flags that choose the cluster, the identity and the namespace.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct KubeArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The namespace (tenant) to work in (default: the context's namespace).
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("reading the kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("building a client from the kubeconfig: {0}")]
    Client(#[source] kube::Error),
    #[error("getting a token for user {user:?}: {source}")]
    Auth {
        user: String,
        #[source]
        source: tower::BoxError,
    },
    #[error(
        "the kubeconfig identity {user:?} has no bearer token ({why}); Herald's API authenticates with Kubernetes bearer tokens. Use a context whose user has a token, tokenFile or exec plugin, or pass --token (for example --token \"$(kubectl create token SERVICEACCOUNT -n NAMESPACE)\")"
    )]
    NoBearerToken { user: String, why: &'static str },
}

/// The cluster and identity chosen by [`KubeArgs`].
pub struct Context {
    pub config: Config,
    /// The namespace: `-n`, else the context's, else `default`.
    pub namespace: String,
    /// The kubeconfig's name for the user, for messages.
    user: String,
    auth: Option<AuthLayer>,
}

impl Context {
    /// Reads the kubeconfig. Runs an `exec` credential plugin once if the identity has
    /// one.
    pub async fn load(args: &KubeArgs) -> Result<Self, ContextError> {
        let KubeArgs {
            kubeconfig,
            context,
            namespace,
        } = args;
        let options = KubeConfigOptions {
            context: context.clone(),
            ..Default::default()
        };
        let file = match kubeconfig {
            Some(path) => Kubeconfig::read_from(path),
            None => Kubeconfig::read(),
        }
        .map_err(ContextError::Kubeconfig)?;
        let user = user_name(&file, context.as_deref());
        let config = Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(ContextError::Kubeconfig)?;
        let auth = config.auth_layer().map_err(ContextError::Client)?;
        let namespace = namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        Ok(Self {
            config,
            namespace,
            user,
            auth,
        })
    }

    /// A Kubernetes client with the user's identity.
    pub fn client(&self) -> Result<Client, ContextError> {
        Client::try_from(self.config.clone()).map_err(ContextError::Client)
    }

    /// The identity's bearer token, fresh (a token file re-read, an exec credential
    /// renewed when it is about to expire).
    pub async fn bearer_token(&self) -> Result<String, ContextError> {
        let no_token = |why| ContextError::NoBearerToken {
            user: self.user.clone(),
            why,
        };
        let Some(auth) = &self.auth else {
            let why = if self.config.auth_info.client_certificate.is_some()
                || self.config.auth_info.client_certificate_data.is_some()
                || self.config.auth_info.exec.is_some()
            {
                "it signs in with a client certificate"
            } else {
                "it has no credentials"
            };
            return Err(no_token(why));
        };
        // kube's layer adds the Authorization header to a request; this service only
        // reads it back, so the token comes from kube's code, refresh included.
        let read_header = tower::service_fn(|request: http::Request<String>| async move {
            let header = request.headers().get(AUTHORIZATION).cloned();
            Ok::<_, tower::BoxError>(http::Response::new(header))
        });
        let header = auth
            .layer(read_header)
            .oneshot(http::Request::new(String::new()))
            .await
            .map_err(|source| ContextError::Auth {
                user: self.user.clone(),
                source,
            })?;
        let value = header
            .body()
            .as_ref()
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        match value.strip_prefix("Bearer ") {
            Some(token) if !token.trim().is_empty() => Ok(token.trim().to_owned()),
            _ if value.starts_with("Basic ") => Err(no_token("it signs in with a password")),
            _ => Err(no_token("it has no credentials")),
        }
    }
}

/// The user name the chosen context refers to.
fn user_name(file: &Kubeconfig, context: Option<&str>) -> String {
    let context = context.or(file.current_context.as_deref());
    file.contexts
        .iter()
        .find(|c| Some(c.name.as_str()) == context)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone())
        .unwrap_or_else(|| "(none)".to_owned())
}
