//! Warning Events on this plugin's Node: what recovery, discovery and the stale-claim
//! check found, for an operator who does not read the plugin's logs.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::resource::v1::ResourceSlice;
use topodra_model::checkpoint::ClaimRecord;
use topodra_node::prepare::StartupReport;
use topodra_ops::backoff::Backoff;

/// Records a Warning Event on this plugin's Node, where `kubectl describe node`
/// shows it (it lists the Events whose involvedObject has the Node's kind, name and
/// uid, so the reference carries the uid); failing to record one is logged, never
/// fatal.
pub(crate) async fn node_event(
    client: kube::Client,
    node: &str,
    reason: &str,
    action: &str,
    note: String,
) {
    let uid = node_uid(&client, node).await;
    let recorder = kube::runtime::events::Recorder::new(
        client,
        kube::runtime::events::Reporter {
            controller: "topodra-kubelet-plugin".into(),
            instance: Some(node.to_owned()),
        },
    );
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: reason.into(),
        note: Some(fit_note(note)),
        action: action.into(),
        secondary: None,
    };
    let node_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        uid,
        ..Default::default()
    };
    if let Err(e) = recorder.publish(&event, &node_ref).await {
        tracing::warn!(error = %e, reason, "could not record an event on the node");
    }
}

/// The Node's uid, read with one GET (retried) the first time an Event is recorded
/// and kept for the life of the process: Events are rare, and a Node keeps its uid
/// as long as this pod runs on it (a recreated Node deletes the pod with it).
static NODE_UID: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();

/// A few attempts, with the publisher's backoff from 0.5 s to at most 4 s: when the
/// API server does not answer for that long, the Event itself would not get through
/// either. `None` then: the Event is still recorded (`kubectl get events` shows it),
/// the next one asks again.
async fn node_uid(client: &kube::Client, node: &str) -> Option<String> {
    const ATTEMPTS: u32 = 5;
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let read = || async {
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(4));
        loop {
            let error = match nodes.get(node).await {
                Ok(n) => match n.metadata.uid {
                    Some(uid) if !uid.is_empty() => return Ok(uid),
                    _ => "the Node has no uid".to_owned(),
                },
                Err(e) => e.to_string(),
            };
            let delay = backoff.next_delay();
            if backoff.attempts() == ATTEMPTS {
                return Err(error);
            }
            tracing::debug!(node, attempt = backoff.attempts(), %error, "reading the Node's uid for an event failed");
            tokio::time::sleep(delay).await;
        }
    };
    match NODE_UID.get_or_try_init(read).await {
        Ok(uid) => Some(uid.clone()),
        Err(error) => {
            tracing::warn!(node, %error, "could not read the Node's uid; the event will not show in `kubectl describe node`");
            None
        }
    }
}

/// The API server refuses an Event whose note is over 1 kB (events.k8s.io/v1
/// validation counts bytes), and the whole Event is lost then. A longer note (many
/// devices, a long path or error) is cut at a character boundary, and says so.
const NOTE_LIMIT: usize = 1024;

fn fit_note(note: String) -> String {
    const CUT: &str = " [...]";
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let mut end = NOTE_LIMIT - CUT.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}", &note[..end])
}

/// Warning Events on the Node for what recovery found wrong with the node's own
/// state, so an operator learns of it without reading logs.
pub(crate) async fn recovery_events(client: kube::Client, node: &str, report: &StartupReport) {
    if let Some(q) = &report.quarantined {
        let note = format!(
            "corrupt checkpoint ({}) moved to {}; rebuilt {} claim(s) from CDI specs",
            q.reason,
            q.path.display(),
            report.rebuilt.len()
        );
        node_event(
            client.clone(),
            node,
            "CheckpointQuarantined",
            "Recover",
            note,
        )
        .await;
    }
    for bad in &report.bad_records {
        node_event(
            client.clone(),
            node,
            "CheckpointRecordDropped",
            "Recover",
            bad.clone(),
        )
        .await;
    }
    if let Some(e) = &report.save_failed {
        let note = format!(
            "recovered state could not be saved ({e}); serving from memory, prepares fail until the disk accepts writes"
        );
        node_event(client, node, "CheckpointNotSaved", "Recover", note).await;
    }
}

/// Earlier versions named this node's slices `<node>-<driver>-<i>`; now the API
/// server names them. A slice of another node or driver under such a name was made
/// to squat it (any identity that may create slices can create one under any
/// name): it no longer matters to publishing, but it says that an identity
/// misbehaves, so each is reported once per start. One GET per slice of the pool.
pub(crate) async fn squatted_names(client: kube::Client, node: &str, driver: &str, slices: usize) {
    let api: kube::Api<ResourceSlice> = kube::Api::all(client.clone());
    for i in 0..slices {
        let name = format!("{node}-{driver}-{i}");
        let slice = match api.get_opt(&name).await {
            Ok(Some(slice)) => slice,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %e, slice = %name, "cannot check an old slice name");
                return;
            }
        };
        let (their_node, their_driver) = (
            slice.spec.node_name.as_deref().unwrap_or(""),
            slice.spec.driver.as_str(),
        );
        if their_node == node && their_driver == driver {
            continue;
        }
        tracing::warn!(slice = %name, node = ?their_node, driver = ?their_driver, "a ResourceSlice of another node or driver has this node's old slice name; it is ignored");
        let note = format!(
            "ResourceSlice {name} carries this node's old slice name but is of node {their_node:?}, driver {their_driver:?}; \
             it is ignored (this node's slices are named by the API server). Find who created it in its managedFields"
        );
        node_event(
            client.clone(),
            node,
            "ResourceSliceNameSquatted",
            "Publish",
            note,
        )
        .await;
    }
}

/// One Event per GPU that discovery left out because of its MIG mode, so an
/// operator sees on the Node why it offers fewer devices than it has GPUs.
pub(crate) async fn mig_events(
    client: kube::Client,
    node: &str,
    inventory: &topodra_model::Inventory,
) {
    for gpu in &inventory.gpus {
        let Some(warning) = topodra_node::discovery::mig_warning(gpu) else {
            continue;
        };
        node_event(client.clone(), node, "GpuNotOffered", "Discover", warning).await;
    }
}

/// One Event when the toolkit CDI spec the plugin adopted held what driver files
/// cannot be (a mount of `/etc/shadow`, `LD_PRELOAD`, another binary as a hook):
/// those entries were dropped, and the Event names each. Recorded in a task of its
/// own, so the start never waits for the API server.
pub(crate) fn toolkit_spec_dropped(
    client: kube::Client,
    node: &str,
    files: &topodra_node::cdi::NvidiaFiles,
) {
    let dropped = files.dropped();
    if dropped.is_empty() {
        return;
    }
    let note = format!(
        "the toolkit CDI spec ({:?}) holds {} entr{} that driver files cannot be, not \
         adopted into claims' specs: {}",
        files.source,
        dropped.len(),
        if dropped.len() == 1 { "y" } else { "ies" },
        dropped.join("; ")
    );
    let node = node.to_owned();
    tokio::spawn(async move {
        node_event(client, &node, "ToolkitSpecNarrowed", "Start", note).await;
    });
}

/// What the stale-claim check calls with each claim it unprepared: an Event on the
/// Node, recorded in a task of its own so the check never waits for the API server.
pub(crate) fn stale_claim_unprepared(
    client: kube::Client,
    node: String,
) -> impl Fn(&ClaimRecord, &str) + Send + Sync {
    move |record, why| {
        let note = format!(
            "unprepared claim {}/{} (UID {}, devices {}): {why}",
            record.namespace,
            record.name,
            record.uid,
            record
                .devices
                .iter()
                .map(|d| d.device.as_str())
                .collect::<Vec<_>>()
                .join(",")
        );
        let (client, node) = (client.clone(), node.clone());
        tokio::spawn(async move {
            node_event(client, &node, "StaleClaimUnprepared", "Unprepare", note).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_fit_the_api_servers_limit() {
        assert_eq!(fit_note("short".into()), "short");
        let exact = "x".repeat(NOTE_LIMIT);
        assert_eq!(fit_note(exact.clone()), exact);
        for long in [
            "y".repeat(5000),
            "\u{e9}".repeat(700),
            "\u{1f600}".repeat(300),
        ] {
            let cut = fit_note(long.clone());
            assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
            assert!(cut.ends_with(" [...]"));
            assert!(long.starts_with(cut.trim_end_matches(" [...]")));
        }
    }
}
