//! Reading the API server: one paginated LIST per resource, straight into the
//! capacity model.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use crate::classes::OurClasses;
use anyhow::{Result, anyhow, bail};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, ObjectList};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use topodra_model::capacity::{Cluster, CpuPools, Finding};
use topodra_ops::bounded::Bounded;

use super::terminal::escape;

/// Items per LIST page: what kubectl asks for, so a 1,000-node cluster takes a few
/// small responses rather than one large one.
pub(crate) const PAGE: u32 = 500;

/// How to reach the API server.
#[derive(Clone, Debug, Default)]
pub(crate) struct Target {
    pub(crate) kubeconfig: Option<PathBuf>,
    pub(crate) context: Option<String>,
    pub(crate) request_timeout: Option<Duration>,
    pub(crate) verbose: bool,
}

/// A client, the namespace of the kubeconfig context, and the server's address for
/// messages.
#[derive(Clone)]
pub(crate) struct Connection {
    pub(crate) client: Client,
    pub(crate) namespace: String,
    server: String,
    verbose: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("namespace", &self.namespace)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// The kubeconfig named by `--kubeconfig`, else by `KUBECONFIG` or `~/.kube/config`
/// (with `--context` if given), else the in-cluster service account.
pub(crate) async fn connect(target: &Target) -> Result<Connection> {
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..Default::default()
    };
    let mut config = match (&target.kubeconfig, &target.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| anyhow!("cannot read kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| anyhow!("cannot use kubeconfig {}: {e}", path.display()))?
        }
        (None, Some(context)) => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| anyhow!("cannot use context {context:?} of the kubeconfig: {e}"))?,
        (None, None) => Config::infer().await.map_err(|e| {
            anyhow!("no Kubernetes configuration (set KUBECONFIG or --kubeconfig): {e}")
        })?,
    };
    if target.request_timeout.is_some() {
        config.read_timeout = target.request_timeout;
        config.reset_reader_on_write = true;
    }
    let server = config.cluster_url.to_string();
    let namespace = config.default_namespace.clone();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("kubectl-topodra/", env!("CARGO_PKG_VERSION"))),
    ));
    let client = Client::try_from(config)
        .map_err(|e| anyhow!("cannot make a client for {server}: {}", describe(&e)))?;
    Ok(Connection {
        client,
        namespace,
        server,
        verbose: target.verbose,
    })
}

/// A kube error in one line: the API server's own message for API errors, the chain
/// of causes without repetitions for the others.
pub(crate) fn describe(err: &kube::Error) -> String {
    if let kube::Error::Api(status) = err {
        let why = if status.reason.is_empty() {
            status.code.to_string()
        } else {
            status.reason.clone()
        };
        return format!("{} ({why})", status.message);
    }
    let mut parts: Vec<String> = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        let text = e.to_string();
        let text = ["ServiceError: ", "HyperError: "]
            .iter()
            .fold(text.as_str(), |t, p| t.strip_prefix(p).unwrap_or(t))
            .to_owned();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    // Each layer tends to repeat its cause in its own message: keep the most precise.
    let mut kept: Vec<String> = Vec::new();
    for p in parts {
        if kept.last().is_some_and(|last| p.contains(last.as_str())) {
            kept.pop();
        }
        kept.push(p);
    }
    kept.join(": ")
}

/// Lists every page of a resource: asks for `PAGE` items at a time, following the
/// continue token. When the token expires mid-list (410 Gone) the list starts over
/// once; feeding the same items again is harmless because the model is keyed by
/// object.
pub(crate) async fn paginate<K, F, Fut>(
    mut fetch: F,
    mut each: impl FnMut(K),
) -> Result<Pages, kube::Error>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<ObjectList<K>, kube::Error>>,
    K: Clone,
{
    let mut pages = Pages::default();
    let mut token: Option<String> = None;
    loop {
        match fetch(token.clone()).await {
            Ok(list) => {
                pages.pages = pages.pages.saturating_add(1);
                pages.items = pages.items.saturating_add(list.items.len());
                list.items.into_iter().for_each(&mut each);
                token = list.metadata.continue_.filter(|t| !t.is_empty());
                if token.is_none() {
                    return Ok(pages);
                }
            }
            Err(kube::Error::Api(s)) if s.code == 410 && token.is_some() && !pages.restarted => {
                pages.restarted = true;
                token = None;
            }
            Err(e) => return Err(e),
        }
    }
}

/// What a paginated list took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pages {
    pub(crate) pages: usize,
    pub(crate) items: usize,
    pub(crate) restarted: bool,
}

impl Connection {
    fn note(&self, text: &str) {
        if self.verbose {
            eprintln!("{text}");
        }
    }

    fn fail(&self, what: &str, e: &kube::Error) -> anyhow::Error {
        match e {
            kube::Error::Api(_) => anyhow!("{what}: {}", describe(e)),
            _ => anyhow!(
                "{what}: cannot reach the API server at {}: {}",
                self.server,
                describe(e)
            ),
        }
    }

    /// Lists every page, each object decoded with bounded depth: an object nested
    /// past the decoder's limit is taken without its deepest values, and one that does
    /// not decode at all is left out with a warning, instead of failing the command.
    async fn list<K>(
        &self,
        api: &Api<Bounded<K>>,
        plural: &str,
        params: &ListParams,
        mut each: impl FnMut(K),
    ) -> Result<Pages, kube::Error>
    where
        K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    {
        let pages = paginate(
            |token| {
                let mut p = params.clone().limit(PAGE);
                if let Some(t) = &token {
                    p = p.continue_token(t);
                }
                async move { api.list(&p).await }
            },
            |b: Bounded<K>| match b.into_result() {
                Ok(object) => each(object),
                Err(u) => eprintln!(
                    "warning: left out {plural} {}: {}",
                    escape(&format!(
                        "{}/{}",
                        u.metadata.namespace.as_deref().unwrap_or_default(),
                        u.metadata.name.as_deref().unwrap_or_default()
                    )),
                    escape(&u.error)
                ),
            },
        )
        .await?;
        self.note(&format!(
            "listed {} {plural} in {} page{}{}",
            pages.items,
            pages.pages,
            if pages.pages == 1 { "" } else { "s" },
            if pages.restarted {
                " (restarted once: continue token expired)"
            } else {
                ""
            },
        ));
        Ok(pages)
    }

    /// The model of the cluster: our driver's slices, every claim's allocation and the
    /// DeviceTaintRules. Claims of `keep_namespace` are also returned, by name.
    /// With `cpus`, the CPU driver's slices are listed too and the claims' CPUs
    /// counted in it.
    pub(crate) async fn cluster(
        &self,
        driver: &str,
        keep_namespace: Option<&str>,
        mut cpus: Option<&mut CpuPools>,
    ) -> Result<(Cluster, BTreeMap<String, ResourceClaim>)> {
        let mut cluster = Cluster::new(driver);
        let slices: Api<Bounded<ResourceSlice>> = Api::all(self.client.clone());
        let by_driver = ListParams::default().fields(&format!("spec.driver={driver}"));
        self.list(&slices, "resourceslices", &by_driver, |s| {
            cluster.apply_slice(&s);
        })
        .await
        .map_err(|e| self.fail("cannot list resourceslices", &e))?;
        for line in findings_report(&cluster.take_findings(), self.verbose) {
            eprintln!("{line}");
        }
        if let Some(cpus) = cpus.as_deref_mut() {
            let by_driver = ListParams::default().fields(&format!("spec.driver={}", cpus.driver()));
            self.list(&slices, "resourceslices", &by_driver, |s| {
                cpus.apply_slice(&s);
            })
            .await
            .map_err(|e| self.fail("cannot list the CPU driver's resourceslices", &e))?;
        }

        let mut kept = BTreeMap::new();
        let claims: Api<Bounded<ResourceClaim>> = Api::all(self.client.clone());
        self.list(&claims, "resourceclaims", &ListParams::default(), |c| {
            cluster.apply_claim(&c);
            if let Some(cpus) = cpus.as_deref_mut() {
                cpus.apply_claim(&c);
            }
            if keep_namespace.is_some()
                && c.metadata.namespace.as_deref() == keep_namespace
                && let Some(name) = c.metadata.name.clone()
            {
                kept.insert(name, c);
            }
        })
        .await
        .map_err(|e| self.fail("cannot list resourceclaims", &e))?;

        let rules: Api<Bounded<DeviceTaintRule>> = Api::all(self.client.clone());
        let listed = self
            .list(&rules, "devicetaintrules", &ListParams::default(), |r| {
                cluster.apply_taint_rule(&r);
            })
            .await;
        match listed {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => self.note(
                "devicetaintrules (resource.k8s.io/v1) are not served here: \
                 unhealthy counts cover the taints in the slices only",
            ),
            Err(kube::Error::Api(s)) if s.is_forbidden() => eprintln!(
                "warning: not allowed to list devicetaintrules: unhealthy counts cover the \
                 taints in the slices only"
            ),
            Err(e) => return Err(self.fail("cannot list devicetaintrules", &e)),
        }
        Ok((cluster, kept))
    }

    /// Which DeviceClasses are ours (those selecting `driver`, and `extra`) and which
    /// are the CPU driver's (those selecting `cpu_driver`).
    pub(crate) async fn classes(
        &self,
        driver: &str,
        extra: &[String],
        cpu_driver: &str,
    ) -> Result<(OurClasses, OurClasses)> {
        let api: Api<Bounded<DeviceClass>> = Api::all(self.client.clone());
        let mut all = Vec::new();
        self.list(&api, "deviceclasses", &ListParams::default(), |c| {
            all.push(c)
        })
        .await
        .map_err(|e| self.fail("cannot list deviceclasses", &e))?;
        Ok((
            OurClasses::from_classes(&all, driver, extra),
            OurClasses::from_classes(&all, cpu_driver, &[]),
        ))
    }

    pub(crate) async fn pod(&self, namespace: &str, name: &str) -> Result<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(name).await {
            Ok(Some(pod)) => Ok(pod),
            Ok(None) => bail!("pod {name:?} not found in namespace {namespace:?}"),
            Err(e) => Err(self.fail(&format!("cannot get pod {namespace}/{name}"), &e)),
        }
    }
}

/// What to say on stderr about what the model did not take from the slices: each
/// skipped pool, since its node's figures are missing; the ignored values as a count,
/// each of them with `verbose`. A finding's text quotes names in escaped form.
fn findings_report(findings: &[Finding], verbose: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let mut ignored: usize = 0;
    for f in findings {
        match f {
            Finding::PoolSkipped { .. } => lines.push(format!("warning: {f}")),
            Finding::InvalidValue { .. } => {
                ignored = ignored.saturating_add(1);
                if verbose {
                    lines.push(format!("warning: {f}"));
                }
            }
        }
    }
    if ignored > 0 {
        lines.push(format!(
            "warning: ignored {ignored} topology value{} in ResourceSlices that no topodra plugin \
             publishes; those devices count as not carrying the attribute{}",
            if ignored == 1 { "" } else { "s" },
            if verbose { "" } else { " (-v lists them)" }
        ));
    }
    lines
}

#[cfg(test)]
mod tests;
