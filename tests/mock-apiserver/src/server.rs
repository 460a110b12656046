//! The mock served over HTTP/1.1 on loopback, for tests of the plugin binary.

use std::net::SocketAddr;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use http_body_util::BodyExt;

use crate::MockApi;

/// A [`MockApi`] listening on a loopback port; derefs to it.
#[derive(Debug)]
pub struct MockApiServer {
    api: MockApi,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Deref for MockApiServer {
    type Target = MockApi;

    fn deref(&self) -> &MockApi {
        &self.api
    }
}

impl MockApiServer {
    /// Starts on a random loopback port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0".parse().map_err(std::io::Error::other)?).await
    }

    /// Starts on `addr`, e.g. the port of a server that was stopped, to bring "the API
    /// server" back.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        Self::serve(MockApi::new(), addr).await
    }

    /// Serves `api` on `addr`.
    pub async fn serve(api: MockApi, addr: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let serving = api.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let api = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let api = api.clone();
                            async move {
                                let (parts, body) = req.into_parts();
                                let body = match BodyExt::collect(body).await {
                                    Ok(b) => b.to_bytes(),
                                    Err(e) => return Err(std::io::Error::other(e)),
                                };
                                // An error closes the connection: a refused request.
                                api.handle(parts, body).await.map_err(std::io::Error::other)
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { api, addr, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state, to keep after [`Self::stop`].
    pub fn api(&self) -> &MockApi {
        &self.api
    }

    /// Stops listening and drops every connection (watches included).
    pub fn stop(self) {
        self.task.abort();
    }

    /// Writes a kubeconfig for this server into `dir` and returns its path.
    pub fn kubeconfig(&self, dir: &Path) -> std::io::Result<PathBuf> {
        write_kubeconfig(dir, self.addr)
    }
}

/// A kubeconfig pointing at `addr` over plain HTTP.
pub fn write_kubeconfig(dir: &Path, addr: SocketAddr) -> std::io::Result<PathBuf> {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: mock\n  cluster:\n    server: http://{addr}\n\
         users:\n- name: mock\n  user: {{}}\ncontexts:\n- name: mock\n  context:\n    cluster: mock\n    user: mock\n\
         current-context: mock\n"
    );
    std::fs::write(&path, text)?;
    Ok(path)
}
