//! The CRD's lifecycle with the chart, on the real API server: `helm install` creates it (the
//! chart renders it as a template, `helm.sh/resource-policy: keep`), `helm upgrade` updates it
//! (a new printer column arrives), `helm uninstall` leaves it; the documented kubectl command
//! updates a CRD that helm manages; and the documented adoption lets the chart take over a CRD
//! that was installed by hand (or by a chart before 0.2.0, from its crds/ directory). A test
//! binary of its own: the CRD is cluster-wide and changes here.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use burst_prefix_test_support::ControlPlane;
use common::repo;

const CRD: &str = "burstprefixpolicies.burstprefix.io";

fn run(command: &mut Command) -> Result<String, String> {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        ))
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A copy of the chart whose CRD has one more printer column, `Producer`.
fn chart_with_new_column(control_plane: &ControlPlane) -> PathBuf {
    let copy = control_plane.dir().join("chart-next");
    copy_dir(&repo().join("charts/burst-prefix"), &copy);
    let file = copy.join("files/crds/burstprefixpolicies.yaml");
    let mut crd: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_sequence_mut()
        .unwrap();
    columns.push(
        serde_yaml::from_str(
            "{name: Producer, type: string, jsonPath: .status.producerUrl, description: the producer's URL}",
        )
        .unwrap(),
    );
    std::fs::write(&file, serde_yaml::to_string(&crd).unwrap()).unwrap();
    copy
}

fn printer_columns(control_plane: &ControlPlane) -> Vec<String> {
    let crd = run(control_plane
        .kubectl()
        .args(["get", "crd", CRD, "-o", "json"]))
    .unwrap();
    let crd: serde_json::Value = serde_json::from_str(&crd).unwrap();
    crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

fn wait_established(control_plane: &ControlPlane) {
    run(control_plane.kubectl().args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        &format!("crd/{CRD}"),
    ]))
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_upgrade_updates_the_crd_uninstall_keeps_it_and_kubectl_can_take_over() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("crd-lifecycle").await.unwrap();
    let chart = repo().join("charts/burst-prefix");
    let install = |chart: &Path, verb: &str| {
        run(control_plane
            .helm()
            .args([verb, "bp", "--namespace", &ns])
            .arg(chart))
    };

    // helm install: the chart's CRD, kept on uninstall.
    install(&chart, "install").unwrap_or_else(|e| panic!("helm install: {e}"));
    wait_established(control_plane);
    let crd = run(control_plane
        .kubectl()
        .args(["get", "crd", CRD, "-o", "json"]))
    .unwrap();
    let crd: serde_json::Value = serde_json::from_str(&crd).unwrap();
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert_eq!(
        crd["metadata"]["annotations"]["meta.helm.sh/release-name"],
        "bp"
    );
    let before = printer_columns(control_plane);
    assert!(!before.contains(&"Producer".to_string()), "{before:?}");

    // helm upgrade to a chart whose CRD has a new printer column: the CRD gets it.
    let next = chart_with_new_column(control_plane);
    install(&next, "upgrade").unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    let after = printer_columns(control_plane);
    assert_eq!(
        after.last().map(String::as_str),
        Some("Producer"),
        "{after:?}"
    );
    assert_eq!(after.len(), before.len() + 1);

    // helm uninstall keeps it.
    run(control_plane
        .helm()
        .args(["uninstall", "bp", "--namespace", &ns]))
    .unwrap();
    assert_eq!(printer_columns(control_plane), after);

    // The chart README's command for a CRD managed by hand (crds.install=false): it updates a
    // CRD whose fields helm's apply owned, where plain `kubectl apply --server-side` conflicts.
    let file = repo().join("crds/burstprefixpolicies.yaml");
    let plain = run(control_plane
        .kubectl()
        .args(["apply", "--server-side", "-f"])
        .arg(&file));
    if let Err(conflict) = &plain {
        assert!(conflict.contains("conflict"), "{conflict}");
    }
    run(control_plane
        .kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(&file))
    .unwrap_or_else(|e| panic!("kubectl apply --server-side --force-conflicts: {e}"));
    assert_eq!(printer_columns(control_plane), before);

    // A CRD the chart did not create (by hand, or from the crds/ directory of a chart before
    // 0.2.0; the one kept above still carries the release's ownership annotations, so it is
    // replaced by a fresh one) is refused by an install that renders it...
    run(control_plane
        .kubectl()
        .args(["delete", "crd", CRD, "--wait=true", "--timeout=60s"]))
    .unwrap();
    run(control_plane
        .kubectl()
        .args(["apply", "--server-side", "-f"])
        .arg(&file))
    .unwrap();
    wait_established(control_plane);
    let refused = install(&chart, "install").unwrap_err();
    assert!(refused.contains("cannot be imported"), "{refused}");
    // ...until it is adopted as the chart README says; then upgrades update it again.
    run(control_plane.kubectl().args([
        "label",
        "--overwrite",
        "crd",
        CRD,
        "app.kubernetes.io/managed-by=Helm",
    ]))
    .unwrap();
    run(control_plane.kubectl().args([
        "annotate",
        "--overwrite",
        "crd",
        CRD,
        "meta.helm.sh/release-name=bp",
        &format!("meta.helm.sh/release-namespace={ns}"),
    ]))
    .unwrap();
    // Helm applies server-side: the first apply after adoption takes the fields over from
    // kubectl, which needs --force-conflicts (without it, the conflict is named).
    let conflict = install(&next, "install").unwrap_err();
    assert!(conflict.contains("conflict with \"kubectl\""), "{conflict}");
    run(control_plane
        .helm()
        .args([
            "upgrade",
            "--install",
            "--force-conflicts",
            "bp",
            "--namespace",
            &ns,
        ])
        .arg(&next))
    .unwrap_or_else(|e| panic!("helm upgrade --install --force-conflicts after adoption: {e}"));
    assert_eq!(
        printer_columns(control_plane).last().map(String::as_str),
        Some("Producer")
    );
}
