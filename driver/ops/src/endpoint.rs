//! The `/metrics`, `/healthz` and `/readyz` endpoint as both binaries run it: one set
//! of flags ([`HttpArgs`], with the same validated defaults), and the served endpoint
//! from its bind until [`Endpoint::stop`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Args;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::http::{Endpoints, HttpLimits, serve};

/// The port the kubelet plugin's endpoint listens on by default; the controller
/// sets its own (9465) with [`HttpArgs::with_default_port`].
pub const DEFAULT_PORT: u16 = 9464;

/// Flags of the `/metrics`, `/healthz` and `/readyz` endpoint.
#[derive(Debug, Clone, Args)]
#[non_exhaustive]
pub struct HttpArgs {
    /// IP address the /metrics, /healthz and /readyz endpoint binds (IPv4 or IPv6,
    /// without brackets). The Helm chart sets the pod's IP.
    #[arg(long, env = "TOPODRA_HTTP_BIND_ADDRESS", default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    pub http_bind_address: IpAddr,

    /// Port of the /metrics, /healthz and /readyz endpoint.
    #[arg(long, env = "TOPODRA_HTTP_PORT", default_value_t = DEFAULT_PORT)]
    pub http_port: u16,

    /// Address and port of the endpoint in one (`127.0.0.1:9464`, `[::1]:9464`);
    /// when set, it takes the place of --http-bind-address and --http-port.
    #[arg(long, env = "TOPODRA_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,

    /// Seconds a client of the endpoint has to send a request's headers (and the
    /// longest an idle connection stays open); slower ones are disconnected.
    #[arg(
        long,
        env = "TOPODRA_HTTP_HEADER_READ_TIMEOUT_SECONDS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub http_header_read_timeout_seconds: u64,

    /// Open connections the endpoint serves at once; further ones are closed at once
    /// (a few more are kept for health probes).
    #[arg(
        long,
        env = "TOPODRA_HTTP_MAX_CONNECTIONS",
        default_value_t = 32,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub http_max_connections: u32,

    /// Seconds a client of the endpoint has to take a response that no longer fits
    /// into the socket; one that reads slower (or not at all) is disconnected.
    #[arg(
        long,
        env = "TOPODRA_HTTP_WRITE_TIMEOUT_SECONDS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub http_write_timeout_seconds: u64,

    /// Requests one keep-alive connection of the endpoint serves before it is closed.
    #[arg(
        long,
        env = "TOPODRA_HTTP_MAX_REQUESTS_PER_CONNECTION",
        default_value_t = 100,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub http_max_requests_per_connection: u32,
}

impl HttpArgs {
    /// `command` (a binary's whole command line, with these flags flattened in) with
    /// `port` as the endpoint's default port, shown as such in `--help`.
    #[must_use]
    pub fn with_default_port(command: clap::Command, port: &'static str) -> clap::Command {
        command.mut_arg("http_port", |a| a.default_value(port))
    }

    /// The address to bind: `--http-addr`, else `--http-bind-address` and `--http-port`.
    pub fn addr(&self) -> SocketAddr {
        self.http_addr
            .unwrap_or(SocketAddr::new(self.http_bind_address, self.http_port))
    }

    /// What one client may hold of the endpoint.
    pub fn limits(&self) -> HttpLimits {
        HttpLimits {
            header_read_timeout: Duration::from_secs(self.http_header_read_timeout_seconds),
            write_timeout: Duration::from_secs(self.http_write_timeout_seconds),
            max_connections: self.http_max_connections as usize,
            max_requests_per_connection: self.http_max_requests_per_connection as usize,
        }
    }
}

/// The endpoint could not bind its address.
#[derive(Debug, thiserror::Error)]
#[error("binding the HTTP endpoint to {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// The endpoint, served until [`Endpoint::stop`].
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Endpoint {
    /// Binds the address of `args` and serves `endpoints` there.
    pub async fn start(args: &HttpArgs, endpoints: Endpoints) -> Result<Self, BindError> {
        let addr = args.addr();
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| BindError { addr, source })?;
        let addr = listener.local_addr().unwrap_or(addr);
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(serve(listener, endpoints, args.limits(), async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        Ok(Self { addr, stop, task })
    }

    /// Where it listens (the bound port when `--http-port` was 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits (a second at most) for the server to end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.task).await;
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        http: HttpArgs,
    }

    fn parse(port: Option<&'static str>, flags: &[&str]) -> Result<HttpArgs, clap::Error> {
        let mut command = Cli::command();
        if let Some(port) = port {
            command = HttpArgs::with_default_port(command, port);
        }
        let matches =
            command.try_get_matches_from(std::iter::once("x").chain(flags.iter().copied()))?;
        Ok(Cli::from_arg_matches(&matches)?.http)
    }

    #[test]
    fn address_from_bind_address_and_port_or_in_one() {
        assert_eq!(
            parse(None, &[]).unwrap().addr(),
            "0.0.0.0:9464".parse().unwrap()
        );
        assert_eq!(
            parse(Some("9465"), &[]).unwrap().addr(),
            "0.0.0.0:9465".parse().unwrap()
        );
        assert_eq!(
            parse(Some("9465"), &["--http-port=1"]).unwrap().addr(),
            "0.0.0.0:1".parse().unwrap()
        );
        assert_eq!(
            parse(
                None,
                &["--http-bind-address=::1", "--http-addr=127.0.0.1:80"]
            )
            .unwrap()
            .addr(),
            "127.0.0.1:80".parse().unwrap()
        );
        let help = HttpArgs::with_default_port(Cli::command(), "9465")
            .render_long_help()
            .to_string();
        assert!(help.contains("[default: 9465]"), "{help}");
    }

    #[test]
    fn limits_of_zero_are_refused() {
        for flag in [
            "--http-header-read-timeout-seconds=0",
            "--http-max-connections=0",
            "--http-write-timeout-seconds=0",
            "--http-max-requests-per-connection=0",
        ] {
            assert!(parse(None, &[flag]).is_err(), "{flag}");
        }
        let limits = parse(None, &[]).unwrap().limits();
        assert_eq!(limits.header_read_timeout, Duration::from_secs(5));
        assert_eq!(limits.max_connections, 32);
    }
}
