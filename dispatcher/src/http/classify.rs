//! What a failed request was: refused by the address policy, the egress proxy's fault
//! (a connect error naming it), a timeout, or the target's; and the one-line text the
//! attempt log keeps of it.

use herald_core::dataplane::AttemptOutcome as Outcome;
use herald_core::ssrf::Forbidden;

use super::redact;
use super::resolve::VetError;
use super::tunnel::ProxyError;

/// A request's failure (direct or proxied): refused by the policy, a connect error (the
/// target's, or an egress proxy's, which names it), or another request error.
pub(super) fn request_error(e: &hyper_util::client::legacy::Error) -> (Outcome, String) {
    let outcome = if has::<Forbidden>(e) {
        Outcome::AddressForbidden
    } else if e.is_connect() || has::<ProxyError>(e) {
        Outcome::ConnectError
    } else {
        Outcome::RequestError
    };
    // From the connector's own error on: hyper's wrapping ("client error (Connect)")
    // says nothing an operator needs.
    let mut source = std::error::Error::source(e);
    let mut cause = source;
    while let Some(err) = cause {
        if err.is::<ProxyError>()
            || err.is::<Forbidden>()
            || err.is::<VetError>()
            || err.is::<super::connect::ConnectFailed>()
        {
            source = Some(err);
            break;
        }
        cause = err.source();
    }
    (outcome, error_chain(outcome, source))
}

/// Whether `T` is anywhere in `e`'s chain of causes.
fn has<T: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(err) = source {
        if err.downcast_ref::<T>().is_some() {
            return true;
        }
        source = err.source();
    }
    false
}

/// The outcome and the error's causes from `source` on, on one line (no URL: it may
/// carry a tenant's query secrets).
fn error_chain(outcome: Outcome, mut source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut text = outcome.as_str().to_owned();
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    redact::redact(&text, &[])
}
