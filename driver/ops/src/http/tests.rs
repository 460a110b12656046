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
    start_with_live(limits, metrics_len, always_ok()).await
}

async fn start_with_live(limits: HttpLimits, metrics_len: usize, live: Check) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rejected = Arc::new(AtomicUsize::new(0));
    let endpoints = Endpoints {
        metrics: Arc::new(move || "x".repeat(metrics_len)),
        live,
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

#[test]
fn a_health_head_ends_at_the_blank_line() {
    for head in [
        "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /readyz HTTP/1.1\nHost: x\n\n",
        "GET /livez HTTP/1.0\r\n\r\n",
    ] {
        assert!(is_health_head(head.as_bytes()), "{head:?}");
    }
    for head in [
        "GET /healthz HTTP/1.1\r\nHost: x\r\n",
        "GET /healthz HTTP/1.1\r\nHost: x\r\n\r",
        "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        assert!(!is_health_head(head.as_bytes()), "{head:?}");
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

    // A health request line whose head does not end within the bound is closed.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let long = format!(
        "GET /healthz HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(MAX_HEALTH_HEAD)
    );
    s.write_all(long.as_bytes()).await.unwrap();
    let answer = read_all(&mut s, Duration::from_secs(2)).await.unwrap();
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    assert_eq!(server.rejected.load(Ordering::SeqCst), 2);

    // Health slots taken by clients that send nothing: a newcomer takes the slot of
    // the oldest, which is closed; the others stay.
    let mut held = Vec::new();
    for _ in 0..HEALTH_SLOTS {
        held.push(TcpStream::connect(server.addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _newcomer = TcpStream::connect(server.addr).await.unwrap();
    assert!(
        read_all(&mut held[0], Duration::from_secs(2))
            .await
            .is_some()
    );
    assert_eq!(server.rejected.load(Ordering::SeqCst), 3);
    for s in &mut held[1..] {
        assert!(read_all(s, Duration::from_millis(100)).await.is_none());
    }
}

/// A connection in a health slot whose whole request head has come keeps its slot:
/// while every health slot holds one, a newcomer is closed at once.
#[tokio::test]
async fn complete_health_requests_keep_their_slots() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let live: Check = {
        let gate = gate.clone();
        Arc::new(move || {
            let gate = gate.clone();
            Box::pin(async move { gate.acquire().await.map(drop).map_err(|e| e.to_string()) })
        })
    };
    let server = start_with_live(limits(1), 16, live).await;
    let _idle = TcpStream::connect(server.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Probes whose liveness check waits for the gate.
    let mut probes = Vec::new();
    for _ in 0..HEALTH_SLOTS {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(request("/healthz", true).as_bytes())
            .await
            .unwrap();
        probes.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut newcomer = TcpStream::connect(server.addr).await.unwrap();
    assert_eq!(
        read_all(&mut newcomer, Duration::from_secs(2)).await,
        Some(Vec::new())
    );
    assert_eq!(server.rejected.load(Ordering::SeqCst), 1);

    gate.add_permits(1);
    for s in &mut probes {
        let answer = read_all(s, Duration::from_secs(2)).await.unwrap();
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}

/// A probe accepted while more connections wait behind it keeps its slot: the
/// server takes them in turn before the probe's task has read its head, but the head
/// is in its socket.
#[tokio::test]
async fn a_probe_keeps_its_slot_from_the_newcomers_queued_behind_it() {
    use std::io::Write;
    let server = start(limits(1), 16).await;
    let _idle = TcpStream::connect(server.addr).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..HEALTH_SLOTS {
        held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Without yielding to the server (the test's one thread): the probe, then as
    // many silent newcomers as it takes to evict every connection before it.
    let mut probe = std::net::TcpStream::connect(server.addr).unwrap();
    probe
        .write_all(request("/healthz", true).as_bytes())
        .unwrap();
    let _newcomers: Vec<_> = (0..HEALTH_SLOTS)
        .map(|_| std::net::TcpStream::connect(server.addr).unwrap())
        .collect();

    probe.set_nonblocking(true).unwrap();
    let mut probe = TcpStream::from_std(probe).unwrap();
    let answer = read_all(&mut probe, Duration::from_secs(2)).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

/// Whether `slot`'s connection was evicted.
fn evicted(slot: &mut HealthSlot) -> bool {
    matches!(
        slot.evicted.try_recv(),
        Err(tokio::sync::oneshot::error::TryRecvError::Closed)
    )
}

#[test]
fn a_newcomer_evicts_the_oldest_connection_whose_head_is_incomplete() {
    let slots = HealthSlots::new(3);
    let mut a = slots.take(None).unwrap();
    let mut b = slots.take(None).unwrap();
    let mut c = slots.take(None).unwrap();
    assert!(b.complete_head());

    let mut d = slots.take(None).expect("a is evicted");
    assert!(evicted(&mut a));
    assert!(!a.complete_head(), "too late");
    let mut e = slots.take(None).expect("c is evicted, b is complete");
    assert!(evicted(&mut c));
    assert!(!evicted(&mut b) && !evicted(&mut d) && !evicted(&mut e));

    // Every slot holds a complete head: a newcomer gets none.
    assert!(d.complete_head() && e.complete_head());
    assert!(slots.take(None).is_none());
    // A slot given up is free again; nobody is evicted for it.
    drop(b);
    let _f = slots.take(None).expect("b's slot");
    assert!(!evicted(&mut d) && !evicted(&mut e));
}

/// A connection whose head has arrived keeps its slot even before its task has read
/// it; one that has sent nothing, or no health request, does not.
#[test]
fn a_head_that_arrived_unread_keeps_the_slot() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = |sent: &[u8]| {
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        client.write_all(sent).unwrap();
        let (server, _) = listener.accept().unwrap();
        if !sent.is_empty() {
            // Blocks until it has arrived.
            server.peek(&mut [0]).unwrap();
        }
        (client, server)
    };
    let slots = HealthSlots::new(1);
    for (sent, kept) in [
        (&b""[..], false),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", false),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", false),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", true),
    ] {
        let (_client, server) = accepted(sent);
        let mut slot = slots.take(peek_handle(&server)).unwrap();
        let newcomer = slots.take(None);
        assert_eq!(
            newcomer.is_none(),
            kept,
            "{}",
            String::from_utf8_lossy(sent)
        );
        assert_eq!(evicted(&mut slot), !kept);
    }
}

/// How a client of [`Flood`] behaves once connected.
#[derive(Debug, Clone, Copy)]
enum Flooder {
    /// Sends nothing.
    Silent,
    /// Sends a health request line and headers a byte at a time, and never ends them.
    Trickling,
}

/// Clients that each connect, behave as told, and reconnect as soon as the server
/// closes them, until dropped.
struct Flood(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Flood {
    fn drop(&mut self) {
        for client in &self.0 {
            client.abort();
        }
    }
}

impl Flood {
    fn start(addr: SocketAddr, clients: usize, how: Flooder) -> Self {
        Self(
            (0..clients)
                .map(|_| {
                    tokio::spawn(async move {
                        loop {
                            match TcpStream::connect(addr).await {
                                Ok(s) => Self::hold(s, how).await,
                                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                            }
                        }
                    })
                })
                .collect(),
        )
    }

    /// Returns once the server has closed `s`.
    async fn hold(mut s: TcpStream, how: Flooder) {
        let (mut rx, mut tx) = s.split();
        let closed = async {
            let mut buf = [0; 1024];
            while let Ok(1..) = rx.read(&mut buf).await {}
        };
        let trickle = async {
            let Flooder::Trickling = how else {
                return std::future::pending().await;
            };
            let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ";
            for byte in head.iter().chain(std::iter::repeat(&b'a')) {
                if tx.write_all(&[*byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            () = closed => {}
            () = trickle => {}
        }
    }
}

/// A probe as the kubelet sends it, its request in one write right after connecting;
/// its status, or `None` if the server closed the connection without an answer. The
/// socket connects and writes without yielding, so on a test's single-threaded
/// runtime the head has arrived before the server sees the connection.
async fn kubelet_probe(addr: SocketAddr) -> Option<u16> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n\r\n",
    )
    .ok()?;
    s.set_nonblocking(true).ok()?;
    let mut s = TcpStream::from_std(s).ok()?;
    // Generous: a probe may wait on a loaded machine, but must not be turned away.
    let answer = read_all(&mut s, Duration::from_secs(10)).await?;
    let text = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Runs kubelet-like probes while `max_connections + HEALTH_SLOTS` flooders that
/// behave as `how` fill every slot and reconnect as soon as they are closed (at their
/// header timeout, or when a probe takes their slot); every probe must be answered.
/// Flood and server share the test's one thread, so that how long the probes' own
/// sends take does not depend on the machine's load: see [`kubelet_probe`].
async fn probes_get_through_a_reconnect_flood(how: Flooder) {
    const PROBES: usize = 80;
    let max_connections = 32;
    let server = start(
        HttpLimits {
            header_read_timeout: Duration::from_secs(2),
            ..limits(max_connections)
        },
        16,
    )
    .await;
    let flood = Flood::start(server.addr, max_connections + HEALTH_SLOTS, how);
    // Every slot taken before the first probe.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for i in 0..PROBES {
        let status = kubelet_probe(server.addr).await;
        if status != Some(200) {
            failed.push((i, status));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    drop(flood);
    eprintln!(
        "{PROBES} probes against a {how:?} reconnect flood: {} failed in {:?} ({} connections closed by the server): {failed:?}",
        failed.len(),
        started.elapsed(),
        server.rejected.load(Ordering::SeqCst),
    );
    assert!(failed.is_empty(), "{failed:?}");
}

#[tokio::test]
async fn probes_get_through_a_reconnect_flood_of_silent_clients() {
    probes_get_through_a_reconnect_flood(Flooder::Silent).await;
}

#[tokio::test]
async fn probes_get_through_a_reconnect_flood_of_trickling_clients() {
    probes_get_through_a_reconnect_flood(Flooder::Trickling).await;
}
