//! End to end on a real node (`make e2e-node`, run by `make test`): the images of `make images`
//! imported into the node's containerd, then the steps of tests/e2e/steps.sh (the chart
//! installed, the operator in-cluster, stub inference pods and a policy, bursts to the
//! producer's Service, the producer pod replaced, the stub pods scaled, two active-active
//! producers rolled to a new image by `helm upgrade` under a steady load, the producers'
//! NetworkPolicy turned on and probed from two namespaces, the chart uninstalled), the same steps
//! tests/e2e/kind.sh runs on kind. The "new image" is the producer image under a second tag
//! ([`ROLL_TAG_SUFFIX`]), given in the node's containerd: nothing is pulled.
//!
//! `harness = false`: the process must enter its own network and mount namespaces before any
//! thread exists (see burst_prefix_test_support::node), which libtest's runner does not allow.
//! It prints libtest's summary line, so that a run's output counts it like any other test.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use burst_prefix_test_support::{node, Node, NodeOptions};

const NAME: &str = "e2e_node";
/// Appended to the producer image's tag to name the image the producers are rolled to.
const ROLL_TAG_SUFFIX: &str = "-roll";

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if std::env::args().any(|a| a == "--list") {
        println!("{NAME}: test");
        return ExitCode::SUCCESS;
    }
    if !filters.is_empty() && !filters.iter().any(|f| NAME.contains(f.as_str())) {
        println!("test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out");
        return ExitCode::SUCCESS;
    }
    println!("running 1 test");
    let start = Instant::now();
    let result = run();
    let seconds = start.elapsed().as_secs_f64();
    match result {
        Ok(()) => {
            println!("test {NAME} ... ok");
            println!(
                "\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; \
                 finished in {seconds:.2}s"
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("{message}");
            println!("test {NAME} ... FAILED");
            println!(
                "\ntest result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered \
                 out; finished in {seconds:.2}s"
            );
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    node::enter_namespaces().map_err(|e| format!("entering the node's namespaces: {e}"))?;
    let images = Images::built()?;
    let started = Instant::now();
    let node = Node::start(NodeOptions {
        images: images.archives.clone(),
        sandbox_image: images.pause.clone(),
    })
    .map_err(|e| format!("starting the node: {e}"))?;
    eprintln!(
        "{NAME}: the node is Ready after {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let producer_next = format!("{}{ROLL_TAG_SUFFIX}", images.producer);
    node.tag_image(&images.producer, &producer_next)
        .map_err(|e| format!("tagging the producer image: {e}"))?;

    let control_plane = node.control_plane();
    let bin = control_plane.binaries().dir();
    let work = node.dir().join("e2e");
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let mut steps = Command::new("bash");
    steps
        .arg(repo().join("tests/e2e/steps.sh"))
        .env("KUBECONFIG", control_plane.kubeconfig())
        .env("KUBECTL", bin.join("kubectl"))
        .env("HELM", bin.join("helm"))
        .env("HELM_CACHE_HOME", work.join("helm/cache"))
        .env("HELM_CONFIG_HOME", work.join("helm/config"))
        .env("HELM_DATA_HOME", work.join("helm/data"))
        .env("E2E_WORK", &work)
        .env("OPERATOR_IMAGE", &images.operator)
        .env("PRODUCER_IMAGE", &images.producer)
        .env("PRODUCER_IMAGE_NEXT", &producer_next)
        .env("STUB_IMAGE", &images.stub_engine)
        // The node's pod network is the CNI bridge plugin, and nothing on the node enforces
        // NetworkPolicy: steps.sh checks that a pod the producer's NetworkPolicy does not admit
        // still reaches it here (and fails if that ever changes, so the docs are updated).
        .env("E2E_NETWORK_POLICY_ENFORCED", "false");
    let status = steps
        .status()
        .map_err(|e| format!("running tests/e2e/steps.sh: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "tests/e2e/steps.sh failed ({status}); the node's logs:\n{}",
            node.logs_tail(40)
        ))
    }
}

/// The images of `make images` (images/build.sh --print-refs names them and their archives).
struct Images {
    operator: String,
    producer: String,
    stub_engine: String,
    pause: String,
    archives: Vec<PathBuf>,
}

impl Images {
    fn built() -> Result<Self, String> {
        let script = repo().join("images/build.sh");
        let output = Command::new("bash")
            .arg(&script)
            .arg("--print-refs")
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{} --print-refs: {}",
                script.display(),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let mut refs = std::collections::BTreeMap::new();
        let mut archives = Vec::new();
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let [name, reference, archive] = line.split(' ').collect::<Vec<_>>()[..] else {
                return Err(format!("unexpected line from --print-refs: {line:?}"));
            };
            let archive = PathBuf::from(archive);
            if !archive.is_file() {
                return Err(format!(
                    "{} is missing: build the images with `make images` (or run `make test`)",
                    archive.display()
                ));
            }
            refs.insert(name.to_owned(), reference.to_owned());
            archives.push(archive);
        }
        let take = |name: &str| {
            refs.get(name)
                .cloned()
                .ok_or_else(|| format!("images/build.sh names no {name} image"))
        };
        Ok(Self {
            operator: take("operator")?,
            producer: take("producer")?,
            stub_engine: take("stub-engine")?,
            pause: take("pause")?,
            archives,
        })
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
