//! `kubectl apply -k deploy/kubernetes` (and `-k deploy/kubernetes-gpu`): what kustomize
//! renders is exactly the numbered manifests that tests/k8s.rs validates strictly; the GPU
//! overlay differs only by its patch and passes the same validation; namespace and image
//! are kustomize fields an overlay sets. `kubectl kustomize` needs no cluster.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{k8s, util};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `kubectl kustomize DIR`, written to `out` and parsed; `None` (with the reason printed)
/// when kubectl is not installed.
fn render(dir: &Path, out: &Path) -> Option<Vec<Value>> {
    let rendered = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
    {
        Ok(rendered) => rendered,
        Err(err) => {
            eprintln!("SKIPPED kustomize render: cannot run kubectl: {err}");
            return None;
        }
    };
    assert!(
        rendered.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        util::text(&rendered)
    );
    std::fs::write(out, &rendered.stdout).expect("write rendered");
    Some(k8s::documents(out))
}

/// Documents ordered by kind and name, so two renderings compare as sets.
fn sorted(mut docs: Vec<Value>) -> Vec<Value> {
    docs.sort_by_key(|d| (d["kind"].to_string(), d["metadata"]["name"].to_string()));
    docs
}

#[test]
fn the_kustomization_renders_exactly_the_validated_manifests() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let Some(base) = render(&deploy().join("kubernetes"), &tmp.path().join("base.yaml")) else {
        return;
    };
    let want = sorted(k8s::all_documents());
    assert_eq!(
        sorted(base),
        want,
        "kustomization.yaml must render the numbered manifests as they are"
    );
}

#[test]
fn the_gpu_overlay_is_the_base_plus_its_patch_and_passes_strict_validation() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("gpu.yaml");
    let Some(gpu) = render(&deploy().join("kubernetes-gpu"), &file) else {
        return;
    };
    let (ok, text) = k8s::validate(&[file]);
    assert!(
        ok,
        "the GPU overlay fails kubernetes-validate --strict:\n{text}"
    );
    assert!(
        text.contains("passed for resource daemonset/energy-bpf"),
        "{text}"
    );
    let base = sorted(k8s::all_documents());
    let gpu = sorted(gpu);
    assert_eq!(gpu.len(), base.len());
    for (g, b) in gpu.iter().zip(&base) {
        if b["kind"] != "DaemonSet" {
            assert_eq!(g, b, "the overlay changes only the DaemonSet");
        }
    }
    let pod = &k8s::kind(&gpu, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["runtimeClassName"], "nvidia");
    assert_eq!(pod["nodeSelector"]["nvidia.com/gpu.present"], "true");
    let env = pod["containers"][0]["env"].as_array().expect("env");
    assert!(
        env.iter().any(|e| e["name"] == "NVIDIA_VISIBLE_DEVICES"),
        "{env:?}"
    );
    assert!(
        env.iter().any(|e| e["name"] == "NODE_NAME"),
        "the base's env is kept: {env:?}"
    );
}

#[test]
fn namespace_and_image_are_kustomize_fields() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let overlay = tmp.path().join("overlay");
    std::fs::create_dir(&overlay).expect("mkdir");
    // kustomize takes only relative roots: up to `/`, then down to the base.
    let base = deploy().join("kubernetes").canonicalize().expect("base");
    let up = "../".repeat(overlay.components().count() - 1);
    let base = format!("{up}{}", base.display().to_string().trim_start_matches('/'));
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             namespace: power\nresources:\n  - {}\nimages:\n  - name: ghcr.io/energy-bpf/energy-bpf\n    \
             newName: registry.example/energy-bpf\n    newTag: v9\n",
            base
        ),
    )
    .expect("write overlay");
    let Some(docs) = render(&overlay, &tmp.path().join("out.yaml")) else {
        return;
    };
    let ds = k8s::kind(&docs, "DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], "power");
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example/energy-bpf:v9"
    );
    let binding = k8s::kind(&docs, "ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["namespace"], "power");
    assert_eq!(k8s::kind(&docs, "Namespace")["metadata"]["name"], "power");
}
