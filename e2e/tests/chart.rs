//! The Helm chart `charts/herald` against the real kube-apiserver: lint, server-side
//! validation of everything it renders, install / upgrade / uninstall, the values schema,
//! and its RBAC — the operator, impersonating the chart's ServiceAccount, reconciles to
//! Ready; the dispatcher's ServiceAccount may do nothing.
//!
//! Each test has its own namespace and its own release name, so cluster-scoped objects
//! (ClusterRole, ClusterRoleBinding, named after the release) never clash between
//! parallel tests. The CRDs are installed cluster-wide by the harness (server-side apply,
//! not Helm), so installs use `crds.install=false`; the CRD templates themselves are
//! checked by rendering and by a server-side dry run.
//!
//! By concern: what the chart renders and refuses ([`render`]), the settings platform
//! teams give each component's pods ([`pod_settings`]), a release's life and its fixed
//! shard count ([`lifecycle`]), its RBAC with the real operator ([`rbac`]) and its
//! monitoring ([`monitoring`]); the release scaffolding they share is here.

use std::time::Duration;

use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookReplay};
use herald_e2e::helm::{chart_dir, documents, helm, helm_docs, kinds, ok, output, template};
use herald_e2e::{TestContext, env, eventually, repo_root, unique_name};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{EnvVar, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

#[path = "chart/lifecycle.rs"]
mod lifecycle;
#[path = "chart/monitoring.rs"]
mod monitoring;
#[path = "chart/pod_settings.rs"]
mod pod_settings;
#[path = "chart/rbac.rs"]
mod rbac;
#[path = "chart/render.rs"]
mod render;

const WAIT: Duration = Duration::from_secs(60);

/// A release of the chart in a test's namespace; uninstalled on [`Release::uninstall`].
struct Release {
    name: String,
    namespace: String,
    /// What `helm install` printed (the rendered NOTES.txt among it).
    installed: String,
}

impl Release {
    fn install(ctx: &TestContext, prefix: &str, set: &[&str]) -> Self {
        let mut release = Self {
            name: unique_name(prefix),
            namespace: ctx.namespace.clone(),
            installed: String::new(),
        };
        release.installed = release.helm("install", set);
        release
    }

    fn helm(&self, action: &str, set: &[&str]) -> String {
        let mut cmd = helm();
        cmd.args([action, &self.name])
            .arg(chart_dir())
            .args(["--namespace", &self.namespace])
            // The harness installed the CRDs cluster-wide (not through Helm).
            .args(["--set", "crds.install=false"])
            // The test API server runs no pods: NATS is never dialled.
            .args(["--set", "nats.url=nats://nats.invalid:4222"]);
        for value in set {
            cmd.args(["--set", value]);
        }
        ok(cmd, None)
    }

    fn fullname(&self) -> String {
        format!("{}-herald", self.name)
    }

    fn operator(&self) -> String {
        format!("{}-operator", self.fullname())
    }

    fn dispatcher(&self) -> String {
        format!("{}-dispatcher", self.fullname())
    }

    /// The manifest Helm installed for this release.
    fn manifest(&self) -> String {
        let mut cmd = helm();
        cmd.args([
            "get",
            "manifest",
            &self.name,
            "--namespace",
            &self.namespace,
        ]);
        ok(cmd, None)
    }

    fn uninstall(&self) -> String {
        let mut cmd = helm();
        cmd.args(["uninstall", &self.name, "--namespace", &self.namespace]);
        ok(cmd, None)
    }
}

/// `kubectl get -f -` of `manifest`: the objects of it that exist, as `kind/name`.
fn existing(manifest: &str, namespace: &str) -> Vec<String> {
    let mut cmd = env().kubectl();
    cmd.args([
        "get",
        "--ignore-not-found",
        "-o",
        "name",
        "-n",
        namespace,
        "-f",
        "-",
    ]);
    let mut names: Vec<String> = ok(cmd, Some(manifest)).lines().map(str::to_owned).collect();
    names.sort();
    names
}

fn env_var<'a>(env: &'a [EnvVar], name: &str) -> Option<&'a EnvVar> {
    env.iter().find(|e| e.name == name)
}

fn env_value(env: &[EnvVar], name: &str) -> Option<String> {
    env_var(env, name).and_then(|e| e.value.clone())
}

fn container_env(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<EnvVar> {
    spec.and_then(|s| s.containers.first())
        .and_then(|c| c.env.clone())
        .unwrap_or_default()
}
