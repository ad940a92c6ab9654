//! Herald's operator: the control plane that reconciles `WebhookEndpoint`,
//! `SigningSecret` and `WebhookReplay`.
//!
//! - [`crdgen`]: the CRD manifests generated from the `herald_core::v1alpha1` types.

#![forbid(unsafe_code)]

pub mod crdgen;
