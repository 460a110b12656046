//! End-to-end tests over real unix sockets: a hand-written HTTP/2 client that sends
//! what grpc-go may send, against tonic and h2 servers behind the shim.

use std::path::Path;
use std::time::Duration;

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

use super::{Incoming, serve_uds};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const PROTOCOL_ERROR: u32 = 0x1;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// What grpc-go sends for a unary call, with the authority under test.
fn get_info(authority: &str) -> Fields {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/pluginregistration.Registration/GetInfo"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.0"),
        ("te", "trailers"),
    ]
    .iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

/// An empty gRPC message: uncompressed, zero length.
const EMPTY_MESSAGE: [u8; 5] = [0; 5];

#[derive(Debug, PartialEq)]
enum Outcome {
    Headers(Fields),
    Reset(u32),
    GoAway(u32),
    Closed,
}

impl Outcome {
    fn header(&self, name: &str) -> Option<String> {
        let Outcome::Headers(fields) = self else {
            return None;
        };
        fields
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// The request got a response with HTTP status 200.
    #[track_caller]
    fn assert_ok(&self) {
        assert_eq!(self.header(":status").as_deref(), Some("200"), "{self:?}");
    }

    /// The server dropped the connection (with or without a GOAWAY).
    #[track_caller]
    fn assert_closed(&self) {
        assert!(
            matches!(self, Outcome::Closed | Outcome::GoAway(_)),
            "{self:?}"
        );
    }
}

/// Just enough of an HTTP/2 client to put exact bytes on the wire.
struct RawClient {
    io: UnixStream,
    /// Stateful like a real client's: repeated new names become table references.
    encoder: Encoder<'static>,
    decoder: Decoder<'static>,
}

impl RawClient {
    async fn connect(path: &Path) -> Self {
        let mut io = UnixStream::connect(path).await.unwrap();
        io.write_all(&[PREFACE, &frame(SETTINGS, 0, 0, &[])].concat())
            .await
            .unwrap();
        Self {
            io,
            encoder: Encoder::new(),
            decoder: Decoder::new(),
        }
    }

    fn encode(&mut self, fields: &Fields) -> Vec<u8> {
        self.encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.unwrap();
    }

    /// Sends a request as one HEADERS frame followed by an empty message.
    async fn unary(&mut self, stream_id: u32, fields: &Fields) -> Outcome {
        let block = self.encode(fields);
        let bytes = [
            frame(HEADERS, END_HEADERS, stream_id, &block),
            frame(DATA, END_STREAM, stream_id, &EMPTY_MESSAGE),
        ]
        .concat();
        self.send(&bytes).await;
        self.outcome(stream_id).await
    }

    async fn read_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut header = [0u8; 9];
        self.io.read_exact(&mut header).await.ok()?;
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let stream_id = u32::from_be_bytes(header[5..9].try_into().unwrap()) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        self.io.read_exact(&mut payload).await.ok()?;
        Some((header[3], header[4], stream_id, payload))
    }

    /// Reads until the server answers `stream_id` with headers or a reset.
    async fn outcome(&mut self, stream_id: u32) -> Outcome {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let Some((kind, flags, id, payload)) = self.read_frame().await else {
                    return Outcome::Closed;
                };
                match kind {
                    SETTINGS if flags & ACK == 0 => {
                        // The server may already have closed the connection; the
                        // next read tells.
                        let _ = self.io.write_all(&frame(SETTINGS, ACK, 0, &[])).await;
                    }
                    HEADERS => {
                        // The servers here neither pad nor split responses.
                        assert_eq!(flags & (END_HEADERS | PADDED | PRIORITY), END_HEADERS);
                        let fields = self.decoder.decode(&payload).unwrap();
                        if id == stream_id {
                            return Outcome::Headers(fields);
                        }
                    }
                    RST_STREAM if id == stream_id => {
                        return Outcome::Reset(u32::from_be_bytes(
                            payload[..4].try_into().unwrap(),
                        ));
                    }
                    GOAWAY => {
                        return Outcome::GoAway(u32::from_be_bytes(
                            payload[4..8].try_into().unwrap(),
                        ));
                    }
                    _ => {}
                }
            }
        })
        .await
        .unwrap()
    }
}

/// A tonic server with no services: every call is answered UNIMPLEMENTED (HTTP 200,
/// grpc-status 12) once it gets past h2, which is all these tests need to see.
fn tonic_server<I, IO>(incoming: I) -> JoinHandle<()>
where
    I: tokio_stream::Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Connected + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    })
}

/// A bare h2 server on the first shimmed connection; returns the authority and
/// content-type of every request it accepted, so tests see what the server saw.
fn h2_server(mut incoming: Incoming) -> JoinHandle<Vec<(String, String)>> {
    tokio::spawn(async move {
        let io = incoming.next().await.unwrap().unwrap();
        let mut connection = h2::server::handshake(io).await.unwrap();
        let mut seen = Vec::new();
        while let Some(Ok((request, mut respond))) = connection.accept().await {
            let authority = request.uri().authority().map(ToString::to_string);
            let content_type = request.headers()["content-type"]
                .to_str()
                .unwrap()
                .to_owned();
            seen.push((authority.unwrap_or_default(), content_type));
            let response = http::Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .header("grpc-status", "0")
                .body(())
                .unwrap();
            respond.send_response(response, true).unwrap();
        }
        seen
    })
}

fn socket_path(dir: &tempfile::TempDir) -> (std::path::PathBuf, String) {
    let path = dir.path().join("plugins_registry/gpu.topodra.dev-reg.sock");
    let authority = path.to_str().unwrap().to_owned();
    (path, authority)
}

#[tokio::test]
async fn path_authority_registration_call_reaches_tonic() {
    let dir = tempfile::tempdir().unwrap();
    let (path, authority) = socket_path(&dir);
    let (_guard, incoming) = serve_uds(&path).unwrap();
    let server = tonic_server(incoming);

    let mut client = RawClient::connect(&path).await;
    let outcome = client.unary(1, &get_info(&authority)).await;
    outcome.assert_ok();
    // tonic routed the call: it just has no such service.
    assert_eq!(
        outcome.header("grpc-status").as_deref(),
        Some("12"),
        "{outcome:?}"
    );
    server.abort();
}

/// Why the shim exists: the same bytes against tonic on a plain socket.
#[tokio::test]
async fn path_authority_is_a_protocol_error_without_the_shim() {
    let dir = tempfile::tempdir().unwrap();
    let (path, authority) = socket_path(&dir);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let server = tonic_server(tokio_stream::wrappers::UnixListenerStream::new(listener));

    let mut client = RawClient::connect(&path).await;
    let outcome = client.unary(1, &get_info(&authority)).await;
    assert_eq!(outcome, Outcome::Reset(PROTOCOL_ERROR));

    // A valid authority on the same connection is fine, so the authority is the
    // only thing wrong with the request.
    let outcome = client.unary(3, &get_info("localhost")).await;
    outcome.assert_ok();
    server.abort();
}

/// HPACK representations built by hand, because loona's encoder never indexes a
/// value whose name is in the static table, while grpc-go's does: its second call
/// sends `:authority` as a reference into the dynamic table.
mod hpack {
    use loona_hpack::encoder::encode_integer_into;

    fn integer(out: &mut Vec<u8>, value: usize, prefix: u8, leading: u8) {
        encode_integer_into(value, prefix, leading, out).unwrap();
    }

    fn string(out: &mut Vec<u8>, value: &[u8]) {
        integer(out, value.len(), 7, 0);
        out.extend_from_slice(value);
    }

    pub(super) fn indexed(out: &mut Vec<u8>, index: usize) {
        integer(out, index, 7, 0x80);
    }

    /// Literal with incremental indexing, name from the table.
    pub(super) fn insert(out: &mut Vec<u8>, name_index: usize, value: &[u8]) {
        integer(out, name_index, 6, 0x40);
        string(out, value);
    }

    /// Literal with incremental indexing, new name.
    pub(super) fn insert_new(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        out.push(0x40);
        string(out, name);
        string(out, value);
    }

    /// Literal without indexing, name from the table.
    pub(super) fn literal(out: &mut Vec<u8>, name_index: usize, value: &[u8]) {
        integer(out, name_index, 4, 0);
        string(out, value);
    }
}

#[tokio::test]
async fn dynamic_table_references_across_requests_still_work() {
    // Static table indices (RFC 7541 Appendix A) and the dynamic ones the first
    // block creates: each insert lands at 62 and pushes older entries up.
    const AUTHORITY: usize = 1;
    const METHOD_POST: usize = 3;
    const PATH: usize = 4;
    const SCHEME_HTTP: usize = 6;
    const CONTENT_TYPE: usize = 31;
    const PATH_VALUE: &[u8] = b"/pluginregistration.Registration/GetInfo";

    let dir = tempfile::tempdir().unwrap();
    let (path, authority) = socket_path(&dir);
    let (_guard, incoming) = serve_uds(&path).unwrap();
    let server = h2_server(incoming);
    let mut client = RawClient::connect(&path).await;

    let mut first = Vec::new();
    hpack::indexed(&mut first, METHOD_POST);
    hpack::indexed(&mut first, SCHEME_HTTP);
    hpack::literal(&mut first, PATH, PATH_VALUE);
    hpack::insert(&mut first, AUTHORITY, authority.as_bytes()); // -> 64 after the next two
    hpack::insert(&mut first, CONTENT_TYPE, b"application/grpc"); // -> 63
    hpack::insert_new(&mut first, b"te", b"trailers"); // -> 62

    let mut second = Vec::new();
    hpack::indexed(&mut second, METHOD_POST);
    hpack::indexed(&mut second, SCHEME_HTTP);
    hpack::literal(&mut second, PATH, PATH_VALUE);
    hpack::indexed(&mut second, 64);
    hpack::indexed(&mut second, 63);
    hpack::indexed(&mut second, 62);
    assert!(
        !second
            .windows(authority.len())
            .any(|w| w == authority.as_bytes())
    );

    // A valid authority after those is passed on as it is.
    let mut third = Vec::new();
    hpack::indexed(&mut third, METHOD_POST);
    hpack::indexed(&mut third, SCHEME_HTTP);
    hpack::literal(&mut third, PATH, PATH_VALUE);
    hpack::literal(&mut third, AUTHORITY, b"gpu.topodra.dev");
    hpack::indexed(&mut third, 63);
    hpack::indexed(&mut third, 62);

    for (stream_id, block) in [(1, first), (3, second), (5, third)] {
        client
            .send(
                &[
                    frame(HEADERS, END_HEADERS, stream_id, &block),
                    frame(DATA, END_STREAM, stream_id, &EMPTY_MESSAGE),
                ]
                .concat(),
            )
            .await;
        let outcome = client.outcome(stream_id).await;
        outcome.assert_ok();
    }

    drop(client);
    let seen = server.await.unwrap();
    let grpc = "application/grpc".to_owned();
    assert_eq!(
        seen,
        vec![
            ("localhost".to_owned(), grpc.clone()),
            ("localhost".to_owned(), grpc.clone()),
            ("gpu.topodra.dev".to_owned(), grpc),
        ]
    );
}

#[tokio::test]
async fn continuation_padded_and_oversized_header_blocks_work() {
    let dir = tempfile::tempdir().unwrap();
    let (path, authority) = socket_path(&dir);
    let (_guard, incoming) = serve_uds(&path).unwrap();
    let server = h2_server(incoming);
    let mut client = RawClient::connect(&path).await;

    // HEADERS + CONTINUATION + CONTINUATION, split mid-field.
    let block = client.encode(&get_info(&authority));
    let (a, rest) = block.split_at(7);
    let (b, c) = rest.split_at(rest.len() / 2);
    client
        .send(
            &[
                frame(HEADERS, 0, 1, a),
                frame(CONTINUATION, 0, 1, b),
                frame(CONTINUATION, END_HEADERS, 1, c),
                frame(DATA, END_STREAM, 1, &EMPTY_MESSAGE),
            ]
            .concat(),
        )
        .await;
    let outcome = client.outcome(1).await;
    outcome.assert_ok();

    // PADDED and PRIORITY, with END_STREAM on HEADERS itself (no body).
    let block = client.encode(&get_info(&authority));
    let payload = [&[4][..], &[0, 0, 0, 0, 15], &block, &[0; 4]].concat();
    client
        .send(&frame(
            HEADERS,
            END_HEADERS | END_STREAM | PADDED | PRIORITY,
            3,
            &payload,
        ))
        .await;
    let outcome = client.outcome(3).await;
    outcome.assert_ok();

    // A block near the servers' limit in several CONTINUATION frames.
    let mut fields = get_info(&authority);
    fields.push((b"x-large".to_vec(), vec![b'x'; 12_000]));
    let block = client.encode(&fields);
    let chunks: Vec<&[u8]> = block.chunks(4_096).collect();
    let mut bytes = frame(HEADERS, 0, 5, chunks[0]);
    for (i, chunk) in chunks.iter().enumerate().skip(1) {
        let flags = if i + 1 == chunks.len() {
            END_HEADERS
        } else {
            0
        };
        bytes.extend(frame(CONTINUATION, flags, 5, chunk));
    }
    bytes.extend(frame(DATA, END_STREAM, 5, &EMPTY_MESSAGE));
    client.send(&bytes).await;
    let outcome = client.outcome(5).await;
    outcome.assert_ok();

    drop(client);
    let seen = server.await.unwrap();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|(a, _)| a == "localhost"), "{seen:?}");
}

#[tokio::test]
async fn a_broken_header_block_closes_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = socket_path(&dir);
    let (_guard, incoming) = serve_uds(&path).unwrap();
    let server = tonic_server(incoming);

    let mut client = RawClient::connect(&path).await;
    // A reference past the end of an empty dynamic table.
    client
        .send(&frame(HEADERS, END_HEADERS, 1, &[0x80 | 70]))
        .await;
    let outcome = client.outcome(1).await;
    outcome.assert_closed();

    // The listener keeps serving other connections.
    let mut client = RawClient::connect(&path).await;
    let outcome = client.unary(1, &get_info("/x.sock")).await;
    outcome.assert_ok();
    server.abort();
}

#[tokio::test]
async fn shimmed_stream_reports_peer_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = socket_path(&dir);
    let (_guard, mut incoming) = serve_uds(&path).unwrap();
    let _client = UnixStream::connect(&path).await.unwrap();
    let stream = incoming.next().await.unwrap().unwrap();

    let info = stream.connect_info();
    let cred = info.peer_cred.unwrap();
    // Whoever created the tempdir is whoever runs this test, i.e. the peer.
    let own_uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(dir.path()).unwrap());
    assert_eq!(cred.uid(), own_uid);
    assert_eq!(cred.pid(), Some(std::process::id().cast_signed()));
    assert!(stream.get_ref().peer_addr().is_ok());
}

/// The shim refuses exactly what tonic (hyper) would: a header list up to the
/// server's limit reaches tonic and is served, one byte over closes the connection
/// (where tonic alone would answer 431).
#[tokio::test]
async fn the_shims_header_limit_is_the_servers() {
    use super::frames::MAX_HEADER_LIST;
    let dir = tempfile::tempdir().unwrap();
    let (path, authority) = socket_path(&dir);
    let (_guard, incoming) = serve_uds(&path).unwrap();
    let server = tonic_server(incoming);

    let with_list_size = |size: usize| {
        let mut fields = get_info(&authority);
        let used: usize = fields.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
        let name = b"x-fill".to_vec();
        let value = vec![b'f'; size - used - name.len() - 32];
        fields.push((name, value));
        fields
    };
    let mut client = RawClient::connect(&path).await;
    let outcome = client.unary(1, &with_list_size(MAX_HEADER_LIST)).await;
    outcome.assert_ok();
    let outcome = client.unary(3, &with_list_size(MAX_HEADER_LIST + 1)).await;
    outcome.assert_closed();
    server.abort();
}

/// The server tells every client the bounds at once, in its first frames: streams at
/// once, and the stream and connection windows.
#[tokio::test]
async fn the_servers_settings_bound_streams_and_windows() {
    use super::{CONNECTION_WINDOW, MAX_CONCURRENT_STREAMS, STREAM_WINDOW, grpc_server};
    const WINDOW_UPDATE: u8 = 0x8;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = socket_path(&dir);
    let (_guard, incoming) = serve_uds(&path).unwrap();
    let server = tokio::spawn(async move {
        grpc_server()
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    let mut client = RawClient::connect(&path).await;
    let (kind, flags, _, payload) = client.read_frame().await.unwrap();
    assert_eq!((kind, flags), (SETTINGS, 0));
    let settings: std::collections::HashMap<u16, u32> = payload
        .chunks(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect();
    assert_eq!(
        settings.get(&0x3),
        Some(&MAX_CONCURRENT_STREAMS),
        "{settings:?}"
    );
    assert_eq!(settings.get(&0x4), Some(&STREAM_WINDOW), "{settings:?}");
    // The connection window grows from the protocol's 65,535 by a WINDOW_UPDATE.
    let increment = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let (kind, _, stream, payload) = client.read_frame().await.unwrap();
            if kind == WINDOW_UPDATE && stream == 0 {
                return u32::from_be_bytes(payload[..4].try_into().unwrap());
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(increment + 65_535, CONNECTION_WINDOW);
    server.abort();
}

/// Request messages of all calls together take at most the budget: a call whose
/// message would take it further fails with RESOURCE_EXHAUSTED, however the bytes
/// are spread over streams, and the bytes come back once a call is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_messages_together_stay_within_the_budget() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use topodra_proto::pluginregistration::v1::registration_server::RegistrationServer;

    use super::RequestBudgetLayer;
    use crate::registration::RegistrationService;

    const BUDGET: usize = 1 << 20;
    const PART: usize = 600 << 10;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = socket_path(&dir);
    let (_guard, incoming) = serve_uds(&path).unwrap();
    let budget = RequestBudgetLayer::new(BUDGET);
    let layer = budget.clone();
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(RegistrationServer::new(RegistrationService {
                driver_name: "example.com".to_owned(),
                endpoint: "dra.sock".to_owned(),
                supported_versions: Vec::new(),
                registered: Arc::new(AtomicBool::new(false)),
            }))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });

    let io = UnixStream::connect(&path).await.unwrap();
    let (mut h2, connection) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(connection);
    // A message that declares 1,000,000 bytes and sends the first `PART` of them.
    async fn start_call(
        h2: &mut h2::client::SendRequest<tonic::codegen::Bytes>,
    ) -> (
        h2::client::ResponseFuture,
        h2::SendStream<tonic::codegen::Bytes>,
    ) {
        let request =
            http::Request::post("http://localhost/pluginregistration.Registration/GetInfo")
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .unwrap();
        *h2 = h2.clone().ready().await.unwrap();
        let (response, mut body) = h2.send_request(request, false).unwrap();
        let mut message = vec![0u8];
        message.extend_from_slice(&1_000_000u32.to_be_bytes());
        message.resize(5 + PART, b'x');
        body.send_data(message.into(), false).unwrap();
        (response, body)
    }
    async fn wait_for(budget: &RequestBudgetLayer, what: &str, cond: impl Fn(usize) -> bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !cond(budget.available()) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}: {} bytes left", budget.available()));
    }

    let (first, first_body) = start_call(&mut h2).await;
    wait_for(&budget, "the first call takes its bytes", |left| {
        left <= BUDGET - PART
    })
    .await;
    let (second, _second_body) = start_call(&mut h2).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .unwrap()
        .unwrap();
    let status = answer
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(status.as_deref(), Some("8"), "{answer:?}");

    // The first call ends (its client gives up): its bytes are free again.
    drop((first, first_body));
    wait_for(&budget, "the bytes come back", |left| left == BUDGET).await;
    server.abort();
}

/// A socket serves at most `MAX_CONNECTIONS` connections; one more is closed as soon
/// as it is accepted, and a slot given back serves the next.
#[tokio::test]
async fn connections_over_the_limit_are_closed_at_once() {
    use super::MAX_CONNECTIONS;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = socket_path(&dir);
    let (_guard, mut incoming) = serve_uds(&path).unwrap();
    let (tx, mut accepted) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        while let Some(Ok(stream)) = incoming.next().await {
            let _ = tx.send(stream);
        }
    });
    let is_closed = async |s: &mut UnixStream| {
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    };

    let mut clients = Vec::new();
    let mut served = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        clients.push(UnixStream::connect(&path).await.unwrap());
        served.push(accepted.recv().await.unwrap());
    }
    let mut extra = UnixStream::connect(&path).await.unwrap();
    assert!(is_closed(&mut extra).await);
    assert!(!is_closed(&mut clients[0]).await);

    drop(served.pop());
    let mut next = UnixStream::connect(&path).await.unwrap();
    let _served = accepted.recv().await.unwrap();
    assert!(!is_closed(&mut next).await);
    server.abort();
}
