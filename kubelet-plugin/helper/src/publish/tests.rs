//! The publisher against a mocked API server, on a simulated clock: which requests it
//! sends, and when it sends none.

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::resource::v1::{
    Device, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use topodra_mock_apiserver::{MockApi, Recorded, SLICES};

use super::{DesiredPool, PublishStatus, Publisher, PublisherConfig};

const NODE: &str = "dgx-01";
const NODE_UID: &str = "6f1e0c1a-8d2b-4b5e-9c4f-0a1b2c3d4e5f";
const DRIVER: &str = "gpu.topodra.dev";

/// A driver's pool on `node`: devices `gpu-0`... with their taints, `max` to a slice,
/// at generation 1 and without an owner. The slices are named `<node>-<driver>-<i>`,
/// as an earlier version of the publisher named them (the publisher itself ignores
/// the names it is given).
pub(super) fn pool_slices(
    node: &str,
    devices: u32,
    max: Option<usize>,
    taints: &BTreeMap<String, Vec<DeviceTaint>>,
) -> Vec<ResourceSlice> {
    let devices: Vec<Device> = (0..devices)
        .map(|i| {
            let name = format!("gpu-{i}");
            Device {
                taints: taints.get(&name).cloned(),
                name,
                ..Default::default()
            }
        })
        .collect();
    let chunks: Vec<Vec<Device>> = if devices.is_empty() {
        vec![Vec::new()]
    } else {
        devices
            .chunks(max.unwrap_or(128))
            .map(<[Device]>::to_vec)
            .collect()
    };
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, devices)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(format!("{node}-{DRIVER}-{i}")),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: DRIVER.to_owned(),
                node_name: Some(node.to_owned()),
                pool: ResourcePool {
                    name: node.to_owned(),
                    generation: 1,
                    resource_slice_count: count,
                },
                devices: (!devices.is_empty()).then_some(devices),
                ..Default::default()
            },
        })
        .collect()
}

fn desired(devices: u32, max: Option<usize>) -> DesiredPool {
    tainted(devices, max, &BTreeMap::new())
}

fn tainted(
    devices: u32,
    max: Option<usize>,
    taints: &BTreeMap<String, Vec<DeviceTaint>>,
) -> DesiredPool {
    DesiredPool::new(pool_slices(NODE, devices, max, taints))
}

/// The slices as the publisher would write them, for seeding the mock.
fn slices(devices: u32, generation: i64, max: Option<usize>) -> Vec<ResourceSlice> {
    let slices = pool_slices(NODE, devices, max, &BTreeMap::new());
    let mut slices = super::publisher::owned_by_node(&slices.into(), NODE, NODE_UID);
    for s in &mut slices {
        s.spec.pool.generation = generation;
    }
    slices
}

/// Requests by verb and resource, as the API server (and a request counter) would
/// count them.
fn counts(requests: &[Recorded]) -> BTreeMap<(&'static str, &'static str), u64> {
    let mut out = BTreeMap::new();
    for r in requests {
        let resource = if r.path.starts_with(SLICES) {
            "resourceslices"
        } else if r.path.starts_with("/api/v1/nodes") {
            "nodes"
        } else {
            "other"
        };
        let verb = match r.method.clone() {
            Method::GET if r.is_watch() && r.has("sendInitialEvents", "true") => "watchlist",
            Method::GET if r.is_watch() => "watch",
            Method::GET if r.path == SLICES => "list",
            Method::GET => "get",
            Method::PATCH => "apply",
            Method::POST if r.path == SLICES => "create",
            Method::DELETE => "delete",
            _ => "other",
        };
        *out.entry((verb, resource)).or_insert(0) += 1;
    }
    out
}

fn config() -> PublisherConfig {
    PublisherConfig::new(DRIVER, NODE)
}

fn mock() -> MockApi {
    let mock = MockApi::new();
    mock.add_node(NODE, NODE_UID);
    mock
}

fn slice_name(i: usize) -> String {
    format!("{NODE}-{DRIVER}-{i}")
}

fn taint(reason: &str) -> DeviceTaint {
    DeviceTaint {
        key: "gpu.topodra.dev/unhealthy".to_owned(),
        value: Some(reason.to_owned()),
        effect: "NoSchedule".to_owned(),
        ..Default::default()
    }
}

struct Running {
    mock: MockApi,
    desired: watch::Sender<DesiredPool>,
    status: watch::Receiver<PublishStatus>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

fn start(mock: &MockApi, config: PublisherConfig, pool: DesiredPool) -> Running {
    let (desired, rx) = watch::channel(pool);
    let publisher = Publisher::new(mock.client(), config, rx);
    let status = publisher.status();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(publisher.run(async {
        let _ = stopped.await;
    }));
    Running {
        mock: mock.clone(),
        desired,
        status,
        stop: Some(stop),
        task,
    }
}

impl Running {
    /// Waits, in simulated time, for a status; then lets the debounce and any echoes
    /// settle, so that "nothing more happens" can be asserted.
    async fn until(&mut self, want: PublishStatus) {
        let wait = self.status.wait_for(|s| *s == want);
        if tokio::time::timeout(Duration::from_secs(300), wait)
            .await
            .is_err()
        {
            panic!("no {want:?}; now {:?}", *self.status.borrow());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    /// Waits for the publisher to report a failure, and returns that status.
    async fn failing(&mut self) -> PublishStatus {
        self.status
            .wait_for(|s| matches!(s, PublishStatus::Failing { .. }))
            .await
            .unwrap()
            .clone()
    }

    fn requests(&self) -> Vec<Recorded> {
        self.mock.requests()
    }

    /// The slice writes: applies and creates.
    fn applies(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.is_apply() || r.is_create())
            .collect()
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

fn generation_of(r: &Recorded) -> i64 {
    r.body.as_ref().unwrap()["spec"]["pool"]["generation"]
        .as_i64()
        .unwrap()
}

fn assert_no_list(requests: &[Recorded]) {
    let lists: Vec<_> = requests.iter().filter(|r| r.is_slice_list()).collect();
    assert!(lists.is_empty(), "LIST requests: {lists:?}");
}

#[tokio::test(start_paused = true)]
async fn startup_is_one_get_one_streaming_watch_and_the_applies_then_silence() {
    let mock = mock();
    let mut run = start(&mock, config(), desired(8, Some(3)));
    run.until(PublishStatus::InSync { generation: 1 }).await;

    let requests = run.requests();
    let shape: Vec<(Method, &str)> = requests
        .iter()
        .map(|r| (r.method.clone(), r.path.as_str()))
        .collect();
    assert_eq!(
        shape,
        [
            (Method::GET, "/api/v1/nodes/dgx-01"),
            (Method::GET, SLICES),
            (Method::POST, SLICES),
            (Method::POST, SLICES),
            (Method::POST, SLICES),
        ]
    );

    let watch = &requests[1].query;
    assert_eq!(watch["watch"], "true");
    assert_eq!(watch["sendInitialEvents"], "true");
    assert_eq!(watch["resourceVersionMatch"], "NotOlderThan");
    assert_eq!(watch["allowWatchBookmarks"], "true");
    assert_eq!(
        watch["fieldSelector"],
        format!("spec.nodeName={NODE},spec.driver={DRIVER}")
    );

    // Created with names the API server makes: no one can take them beforehand.
    for create in &requests[2..] {
        assert_eq!(
            create.query["fieldManager"],
            "gpu.topodra.dev-kubelet-plugin"
        );
        let body = create.body.as_ref().unwrap();
        assert_eq!(
            body["metadata"]["generateName"],
            format!("{NODE}-{DRIVER}-")
        );
        assert!(body["metadata"].get("name").is_none(), "{body}");
        assert_eq!(body["spec"]["pool"]["generation"], 1);
        assert_eq!(body["spec"]["pool"]["resourceSliceCount"], 3);
        let owner = &body["metadata"]["ownerReferences"][0];
        assert_eq!(
            (&owner["kind"], &owner["name"], &owner["uid"]),
            (&"Node".into(), &NODE.into(), &NODE_UID.into())
        );
    }
    let stored = mock.stored();
    assert_eq!(stored.len(), 3);
    assert!(
        stored
            .keys()
            .all(|n| n.starts_with(&format!("{NODE}-{DRIVER}-"))
                && n.len() == format!("{NODE}-{DRIVER}-").len() + 5),
        "{:?}",
        stored.keys()
    );

    let want = BTreeMap::from([
        (("get", "nodes"), 1),
        (("watchlist", "resourceslices"), 1),
        (("create", "resourceslices"), 3),
    ]);
    assert_eq!(counts(&requests), want);

    // Ten idle minutes: the server ends each watch after timeoutSeconds, and the
    // publisher only resumes it from where it was, without a relist.
    let last_seen = mock.resource_version();
    let before = requests.len();
    tokio::time::sleep(Duration::from_secs(600)).await;
    let later = &run.requests()[before..];
    assert!(!later.is_empty(), "the watch was never resumed");
    for r in later {
        assert!(r.is_watch() && r.path == SLICES, "unexpected request {r:?}");
        assert_eq!(r.query["resourceVersion"], last_seen);
        assert!(!r.query.contains_key("sendInitialEvents"), "{r:?}");
    }
    // 290 s per watch: two resumptions in ten minutes.
    assert_eq!(later.len(), 2, "{later:?}");
    assert_no_list(&run.requests());
    let counted = counts(&run.requests());
    assert_eq!(counted[&("watch", "resourceslices")], 2);
    assert!(!counted.contains_key(&("list", "resourceslices")));
    assert!(run.status.borrow().is_in_sync());
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_written_when_nothing_changed_and_a_taint_is_one_apply() {
    let mock = mock();
    mock.seed(&slices(8, 3, None));
    let mut run = start(&mock, config(), desired(8, None));
    run.until(PublishStatus::InSync { generation: 3 }).await;
    let requests = run.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert!(run.applies().is_empty());

    // A GPU goes bad: one apply, one generation up. The server defaults the taint's
    // timeAdded, and that must not look like a difference.
    let taints = BTreeMap::from([("gpu-2".to_owned(), vec![taint("xid-79")])]);
    let pool = tainted(8, None, &taints);
    run.desired.send_replace(pool.clone());
    run.until(PublishStatus::InSync { generation: 4 }).await;
    let applies = run.applies();
    assert_eq!(applies.len(), 1);
    assert_eq!(generation_of(&applies[0]), 4);
    let devices = applies[0].body.as_ref().unwrap()["spec"]["devices"].clone();
    let gpu2 = devices
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "gpu-2")
        .unwrap();
    assert_eq!(gpu2["taints"][0]["value"], "xid-79");
    let stored = &mock.stored()[&slice_name(0)];
    assert!(stored["spec"]["devices"].to_string().contains("timeAdded"));

    // The same value again is no change at all.
    run.desired.send_replace(pool);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(run.applies().len(), 1);

    // All eight GPUs go bad one after another: one apply once they are done.
    let mut taints = BTreeMap::new();
    for gpu in 0..8 {
        taints.insert(format!("gpu-{gpu}"), vec![taint("xid-48")]);
        run.desired.send_replace(tainted(8, None, &taints));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    run.until(PublishStatus::InSync { generation: 5 }).await;
    let applies = run.applies();
    assert_eq!(applies.len(), 2, "{applies:?}");
    assert_eq!(generation_of(&applies[1]), 5);
    assert_no_list(&run.requests());
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_wiped_pool_is_published_again() {
    let mock = mock();
    let mut run = start(&mock, config(), desired(2, None));
    run.until(PublishStatus::InSync { generation: 1 }).await;
    assert_eq!(run.applies().len(), 1);

    let first = mock.stored().into_keys().next().unwrap();
    mock.wipe(&first);
    run.until(PublishStatus::InSync { generation: 2 }).await;
    let applies = run.applies();
    assert_eq!(applies.len(), 2);
    assert!(applies[1].is_create());
    assert_eq!(generation_of(&applies[1]), 2);
    let stored = mock.stored();
    assert_eq!(stored.len(), 1, "{:?}", stored.keys());
    assert!(!stored.contains_key(&first), "a new name for a new object");
    assert_no_list(&run.requests());
    run.stop().await;
}

/// The gaps between `times` are the publisher's backoff: 0.5 s doubling, with up to
/// 25% taken off by jitter.
#[track_caller]
fn assert_backoff(times: &[Duration]) {
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, base) in gaps.iter().zip([500, 1000, 2000, 4000]) {
        let base = Duration::from_millis(base);
        assert!(*gap >= base.mul_f64(0.75) && *gap <= base, "gaps {gaps:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_api_server_is_retried_with_backoff() {
    let mock = mock();
    mock.make_unreachable_for(4);
    let mut run = start(&mock, config(), desired(1, None));
    let failing = run.failing().await;
    assert!(matches!(failing, PublishStatus::Failing { error, .. } if error.contains("dgx-01")));
    run.until(PublishStatus::InSync { generation: 1 }).await;

    let requests = run.requests();
    let gets: Vec<Duration> = requests
        .iter()
        .filter(|r| r.path == "/api/v1/nodes/dgx-01")
        .map(|r| r.at)
        .collect();
    assert_eq!(gets.len(), 5, "{requests:?}");
    assert_backoff(&gets);
    assert_eq!(requests.iter().filter(|r| r.is_watch()).count(), 1);
    assert_eq!(run.applies().len(), 1);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failed_writes_are_retried_with_backoff() {
    let mock = mock();
    mock.fail_applies(2);
    let mut run = start(&mock, config(), desired(1, None));
    run.until(PublishStatus::InSync { generation: 1 }).await;
    let applies = run.applies();
    assert_eq!(applies.len(), 3);
    // A failed write was never written: the retry keeps its generation.
    assert!(applies.iter().all(|a| generation_of(a) == 1));
    assert_backoff(&applies.iter().map(|a| a.at).collect::<Vec<_>>());
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_shrinking_pool_applies_then_deletes_the_extra_slice() {
    let mock = mock();
    mock.seed(&slices(8, 2, Some(3)));
    let mut run = start(&mock, config(), desired(5, Some(3)));
    run.until(PublishStatus::InSync { generation: 3 }).await;

    let writes: Vec<Recorded> = run
        .requests()
        .into_iter()
        .filter(|r| r.is_apply() || r.is_delete())
        .collect();
    let shape: Vec<(Method, String)> = writes
        .iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        shape,
        [
            (Method::PATCH, format!("{SLICES}/{}", slice_name(0))),
            (Method::PATCH, format!("{SLICES}/{}", slice_name(1))),
            (Method::DELETE, format!("{SLICES}/{}", slice_name(2))),
        ]
    );
    for apply in &writes[..2] {
        let pool = &apply.body.as_ref().unwrap()["spec"]["pool"];
        assert_eq!(
            (
                pool["generation"].as_i64(),
                pool["resourceSliceCount"].as_i64()
            ),
            (Some(3), Some(2))
        );
    }
    // Deleted only if it is still the slice we saw.
    let uid = &writes[2].body.as_ref().unwrap()["preconditions"]["uid"];
    assert!(
        uid.as_str()
            .unwrap()
            .starts_with("uid-dgx-01-gpu.topodra.dev-2")
    );
    assert_eq!(mock.stored().len(), 2);
    assert_eq!(counts(&run.requests())[&("delete", "resourceslices")], 1);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_invalid_pool_is_not_written_and_says_why() {
    let mock = mock();
    let mut run = start(
        &mock,
        config(),
        DesiredPool::Invalid("bad attribute".to_owned()),
    );
    let failing = run.failing().await;
    assert!(
        matches!(&failing, PublishStatus::Failing { error, .. } if error.contains("bad attribute")),
        "{failing:?}"
    );
    // A slice of another node is refused too: the watch would never show it.
    let mut other = pool_slices("other-node", 1, None, &BTreeMap::new());
    other[0].metadata.name = Some("other".to_owned());
    run.desired.send_replace(DesiredPool::new(other));
    let failing = run
        .status
        .wait_for(
            |s| matches!(s, PublishStatus::Failing { error, .. } if error.contains("other-node")),
        )
        .await
        .unwrap()
        .clone();
    assert!(matches!(failing, PublishStatus::Failing { .. }));
    assert!(run.applies().is_empty());
    // A valid pool is published as soon as it comes.
    run.desired.send_replace(desired(2, None));
    run.until(PublishStatus::InSync { generation: 1 }).await;
    assert_eq!(run.applies().len(), 1);
    run.stop().await;
}

/// With fixed names, a node-bound identity could create a slice of its own node
/// under this node's name, and this node's publisher would apply to it for ever
/// (`spec.pool.name` is immutable). Such a slice is not ours (the watch does not
/// even show it), and ours get names of their own.
#[tokio::test(start_paused = true)]
async fn a_slice_squatting_our_old_name_is_left_alone() {
    let mock = mock();
    let mut squatter = pool_slices("evil-node", 1, None, &BTreeMap::new());
    squatter[0].metadata.name = Some(slice_name(0));
    mock.seed(&squatter);
    let mut run = start(&mock, config(), desired(2, None));
    run.until(PublishStatus::InSync { generation: 1 }).await;
    let applies = run.applies();
    assert_eq!(applies.len(), 1);
    assert!(applies[0].is_create(), "{:?}", applies[0]);
    let stored = mock.stored();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[&slice_name(0)]["spec"]["nodeName"], "evil-node");
    let ours: Vec<&serde_json::Value> = stored
        .values()
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .collect();
    assert_eq!(ours.len(), 1);
    assert!(
        run.requests()
            .iter()
            .all(|r| !r.path.ends_with(&slice_name(0))),
        "a request went to the squatter's object"
    );
    run.stop().await;
}

/// Two slices of ours with the same devices (a create whose echo was lost, then
/// created again): one is kept, the other deleted.
#[tokio::test(start_paused = true)]
async fn a_duplicate_slice_of_ours_is_deleted() {
    let mock = mock();
    let mut twice = slices(2, 4, None);
    let mut copy = twice[0].clone();
    copy.metadata.name = Some(format!("{NODE}-{DRIVER}-copy1"));
    twice.push(copy);
    mock.seed(&twice);
    let mut run = start(&mock, config(), desired(2, None));
    run.until(PublishStatus::InSync { generation: 5 }).await;
    let stored = mock.stored();
    assert_eq!(stored.len(), 1, "{:?}", stored.keys());
    assert_eq!(counts(&run.requests())[&("delete", "resourceslices")], 1);
    run.stop().await;
}

/// With ordered names the server's names sort in pool order, and a restarted
/// publisher finds them in sync: nothing is written twice.
#[tokio::test(start_paused = true)]
async fn ordered_names_sort_in_pool_order_and_survive_a_restart() {
    let mock = mock();
    let mut ordered = config();
    ordered.ordered_slice_names = true;
    let mut run = start(&mock, ordered.clone(), desired(8, Some(3)));
    run.until(PublishStatus::InSync { generation: 1 }).await;
    // mock.stored() is by name, so in the order the allocator walks the slices.
    let stored = mock.stored();
    let by_name: Vec<(&String, &serde_json::Value)> = stored.iter().collect();
    let first_devices: Vec<&str> = by_name
        .iter()
        .map(|(_, s)| s["spec"]["devices"][0]["name"].as_str().unwrap())
        .collect();
    // Three devices to a slice, in pool order: gpu-0, gpu-3, gpu-6 lead them.
    assert_eq!(first_devices, ["gpu-0", "gpu-3", "gpu-6"]);
    for (i, (name, _)) in by_name.iter().enumerate() {
        assert!(
            name.starts_with(&format!("{NODE}-{DRIVER}-0{i}-")),
            "{name}"
        );
    }
    run.stop().await;

    let before = mock.requests().len();
    let mut again = start(&mock, ordered, desired(8, Some(3)));
    again.until(PublishStatus::InSync { generation: 1 }).await;
    let writes = mock.requests()[before..]
        .iter()
        .filter(|r| r.method != Method::GET)
        .count();
    assert_eq!(writes, 0);
    again.stop().await;
}
