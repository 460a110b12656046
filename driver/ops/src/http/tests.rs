use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;

use super::*;

const BIG: usize = 8 << 20;

struct Server {
    addr: SocketAddr,
    rejected: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn limits(max_connections: usize) -> HttpLimits {
    HttpLimits {
        header_read_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(60),
        max_connections,
        max_requests_per_connection: 100,
    }
}

/// An endpoint on loopback whose metrics are `metrics_len` bytes: more than the
/// socket buffers hold, so a client that does not read blocks the server.
async fn start(limits: HttpLimits, metrics_len: usize) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rejected = Arc::new(AtomicUsize::new(0));
    let endpoints = Endpoints {
        metrics: Arc::new(move || "x".repeat(metrics_len)),
        live: always_ok(),
        ready: always_ok(),
        rejected: {
            let rejected = rejected.clone();
            Arc::new(move || {
                rejected.fetch_add(1, Ordering::SeqCst);
            })
        },
    };
    let task = tokio::spawn(serve(listener, endpoints, limits, std::future::pending()));
    Server {
        addr,
        rejected,
        task,
    }
}

fn request(path: &str, close: bool) -> String {
    let connection = if close { "Connection: close\r\n" } else { "" };
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{connection}\r\n")
}

/// Everything the server sends on `s` until it closes it, within `limit`; `None`
/// if it is still open then.
async fn read_all(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(out)
}

/// The status of one request on a connection of its own, answered within
/// `limit`; `None` if the server closed it without an answer or took longer.
async fn get(addr: SocketAddr, path: &str, limit: Duration) -> Option<u16> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(request(path, true).as_bytes()).await.ok()?;
    let answer = read_all(&mut s, limit).await?;
    let text = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
    text.split_whitespace().nth(1)?.parse().ok()
}

/// A client that pipelines `requests` scrapes and reads none of the answers, with
/// a small receive buffer so the server's writes soon have to wait.
async fn slow_reader(addr: SocketAddr, requests: usize) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    s.write_all(request("/metrics", false).repeat(requests).as_bytes())
        .await
        .unwrap();
    s
}

#[test]
fn only_health_request_lines_are_health_requests() {
    for line in [
        "GET /healthz HTTP/1.1",
        "GET /livez HTTP/1.1",
        "GET /readyz?verbose HTTP/1.1",
    ] {
        assert_eq!(is_health_request(line.as_bytes()), Some(true), "{line}");
    }
    for head in ["", "G", "GET /", "GET /he", "GET /healthz"] {
        assert_eq!(is_health_request(head.as_bytes()), None, "{head}");
    }
    for head in [
        "GET /metr",
        "POST /healthz",
        "GET /healthzz",
        "GET /readyz/x",
        "\x16\x03",
    ] {
        assert_eq!(is_health_request(head.as_bytes()), Some(false), "{head}");
    }
}

/// Clients that pipeline scrapes and never read hold every connection slot, for
/// as long as the write timeout lets them; the probes still get through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_get_through_while_slow_readers_hold_every_slot() {
    let server = start(limits(4), BIG).await;
    let mut slow = Vec::new();
    for _ in 0..6 {
        slow.push(slow_reader(server.addr, 3).await);
    }
    // Every slot is taken: a scrape is refused.
    assert_eq!(
        get(server.addr, "/metrics", Duration::from_secs(2)).await,
        None
    );

    let started = std::time::Instant::now();
    let mut answered = 0;
    for i in 0..30 {
        let path = ["/healthz", "/livez", "/readyz"][i % 3];
        if get(server.addr, path, Duration::from_secs(2)).await == Some(200) {
            answered += 1;
        }
    }
    eprintln!(
        "30 probes against 6 slow readers: {answered} answered in {:?}",
        started.elapsed()
    );
    assert_eq!(answered, 30);
    assert!(server.rejected.load(Ordering::SeqCst) >= 1);
    drop(slow);
}

/// A client that does not take its answer is closed after the write timeout, and
/// its slot serves others again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_is_closed_after_the_write_timeout() {
    let server = start(
        HttpLimits {
            write_timeout: Duration::from_millis(300),
            ..limits(1)
        },
        BIG,
    )
    .await;
    let mut slow = slow_reader(server.addr, 3).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Closed: what it reads now is what the socket buffers held, less than the
    // first of its three answers, and then the end.
    let got = read_all(&mut slow, Duration::from_secs(10))
        .await
        .expect("the server closes the connection");
    assert!(got.len() < BIG, "{} bytes", got.len());
    assert_eq!(
        get(server.addr, "/metrics", Duration::from_secs(5)).await,
        Some(200)
    );
}

#[tokio::test]
async fn a_keep_alive_connection_serves_at_most_max_requests() {
    let server = start(
        HttpLimits {
            header_read_timeout: Duration::from_secs(1),
            max_requests_per_connection: 3,
            ..limits(4)
        },
        16,
    )
    .await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(request("/healthz", false).repeat(5).as_bytes())
        .await
        .unwrap();
    let answer = read_all(&mut s, Duration::from_secs(5)).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert_eq!(answer.matches("http/1.1 200").count(), 3, "{answer}");
    // The third answer says so.
    assert_eq!(answer.matches("connection: close").count(), 1, "{answer}");
}

/// A connection in a health slot gets one probe answered; anything else closes
/// it as soon as its request line shows, and is counted.
#[tokio::test]
async fn a_health_slot_serves_one_probe_and_nothing_else() {
    let server = start(limits(1), 16).await;
    // Holds the one ordinary slot: connected, nothing sent yet.
    let _idle = TcpStream::connect(server.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    assert_eq!(
        get(server.addr, "/metrics", Duration::from_secs(1)).await,
        None
    );
    assert_eq!(server.rejected.load(Ordering::SeqCst), 1);
    assert_eq!(
        get(server.addr, "/readyz", Duration::from_secs(1)).await,
        Some(200)
    );

    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(request("/healthz", false).repeat(2).as_bytes())
        .await
        .unwrap();
    let answer = read_all(&mut s, Duration::from_secs(2)).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 1, "{answer}");

    // Health slots taken by clients that send nothing; one more is closed at once.
    let mut held = Vec::new();
    for _ in 0..HEALTH_SLOTS {
        held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = TcpStream::connect(server.addr).await.unwrap();
    assert!(
        read_all(&mut extra, Duration::from_millis(500))
            .await
            .is_some()
    );
    assert_eq!(server.rejected.load(Ordering::SeqCst), 2);
}
