//! Reading a claim for prepare: one GET by namespace and name, never a list or watch.

use std::future::Future;
use std::pin::Pin;

use k8s_openapi::api::resource::v1::ResourceClaim;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where prepare gets a claim's current object.
pub(crate) trait ClaimReader: Send + Sync {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>>;
}

/// Reads claims from the API server.
#[derive(Clone)]
pub(crate) struct ApiClaims {
    client: kube::Client,
}

impl ApiClaims {
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl ClaimReader for ApiClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>> {
        Box::pin(async move {
            kube::Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| format!("reading claim {namespace}/{name}: {e}"))
        })
    }
}
