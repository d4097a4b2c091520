//! `cargo xtask deb [--install-test]`: a Debian package of the release binary, built by
//! hand with `dpkg-deb` (no cargo-deb to install): the binary, man pages and bash/zsh/fish
//! completions generated from the CLI's own definition (`energy-bpf assets`), the systemd
//! unit from `packaging/`, `/etc/energy-bpf/agent.toml` as a conffile, and a postinst that
//! creates the `energy-bpf` group (people allowed to read the agent's socket).
//!
//! `--install-test` then installs it into a fresh Debian root made by `debootstrap`
//! (minbase of this machine's release, kept under `target/deb/` for the next run) and
//! checks what landed: files, the group, the conffile kept across a reinstall, the binary
//! running there, and a purge that leaves nothing behind.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::util::{self, Result};

/// Builds the package (and tests its installation with `--install-test`).
pub fn run(args: &[String]) -> Result {
    let install_test = match args {
        [] => false,
        [a] if a == "--install-test" => true,
        // What `cargo xtask test` runs, on the debug build.
        [a] if a == "--test" => {
            util::cargo(&["build", "--locked", "-p", "energy-bpf"])?;
            return test_package(&util::root().join("target/debug/energy-bpf"));
        }
        _ => return Err("usage: cargo xtask deb [--install-test | --test]".into()),
    };
    util::cargo(&["build", "--release", "--locked", "-p", "energy-bpf"])?;
    let root = util::root();
    let deb = build(
        &root.join("target/release/energy-bpf"),
        &root.join("target/deb"),
    )?;
    println!("xtask: built {}", deb.display());
    if install_test {
        self::install_test(&deb, &root.join("target/deb"))?;
        println!("xtask: install test passed");
    }
    Ok(())
}

/// This machine's Debian release (`bookworm`), which the test root is made of.
fn suite() -> String {
    util::output("sh", &["-c", ". /etc/os-release && echo $VERSION_CODENAME"])
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "bookworm".into())
}

/// The package test of `cargo xtask test`: the package built around `bin` (the suite's
/// debug build: the layout is what is tested, not the optimiser), `lintian` on it, and the
/// install test. Skipped, saying why, only where Debian's archive cannot be reached
/// (debootstrap needs it).
pub fn test_package(bin: &Path) -> Result {
    let out = util::root().join("target/deb-test");
    let deb = build(bin, &out)?;
    if util::output("lintian", &["--version"]).is_none() {
        util::status(Command::new("apt-get").args(["install", "-y", "lintian"]))?;
    }
    util::status(
        Command::new("lintian")
            .args(["--fail-on", "error,warning"])
            .arg(&deb),
    )?;
    let release = format!("http://deb.debian.org/debian/dists/{}/Release", suite());
    if !out
        .join(format!("debootstrap-{}/usr/bin/dpkg", suite()))
        .exists()
        // Without curl the probe cannot tell: debootstrap then tries, and says what failed.
        && util::output("curl", &["--version"]).is_some()
        && util::output("curl", &["-sfI", "-m", "20", &release]).is_none()
    {
        eprintln!(
            "xtask: SKIPPED the package install test: Debian's archive (deb.debian.org) is \
             not reachable, and debootstrap needs it"
        );
        return Ok(());
    }
    install_test(&deb, &out)?;
    eprintln!("xtask: package test passed: lintian clean, installed, verified and removed");
    Ok(())
}

fn write(path: &Path, text: &str, mode: u32) -> Result {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn copy(from: &Path, to: &Path, mode: u32) -> Result {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::copy(from, to).map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", to.display()))
}

/// The version the binary reports (`energy-bpf 0.1.0`).
fn version(bin: &Path) -> Result<String> {
    let out = util::output(&bin.display().to_string(), &["--version"])
        .ok_or_else(|| format!("{} --version failed", bin.display()))?;
    out.split_whitespace()
        .nth(1)
        .map(str::to_string)
        .ok_or_else(|| format!("no version in `{out}`"))
}

/// Lays the package's files out under `out/root` and packs them; returns the .deb. It
/// depends on procps for the unit's `ExecReload=/bin/kill`.
fn build(bin: &Path, out: &Path) -> Result<PathBuf> {
    let version = version(bin)?;
    let arch = util::output("dpkg", &["--print-architecture"])
        .map(|a| a.trim().to_string())
        .ok_or("dpkg --print-architecture failed (not a Debian machine?)")?;
    let stage = out.join("root");
    if stage.exists() {
        std::fs::remove_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    }
    copy(bin, &stage.join("usr/bin/energy-bpf"), 0o755)?;
    util::status(Command::new("strip").arg(stage.join("usr/bin/energy-bpf")))?;

    // Man pages and completions from the binary itself: they cannot drift from --help.
    let gen_dir = out.join("generated");
    let _ = std::fs::remove_dir_all(&gen_dir);
    util::status(
        Command::new(bin)
            .arg("assets")
            .arg("--man")
            .arg(gen_dir.join("man"))
            .arg("--completions")
            .arg(gen_dir.join("completions")),
    )?;
    let man1 = stage.join("usr/share/man/man1");
    std::fs::create_dir_all(&man1).map_err(|e| e.to_string())?;
    for page in std::fs::read_dir(gen_dir.join("man")).map_err(|e| e.to_string())? {
        let page = page.map_err(|e| e.to_string())?.path();
        let name = page.file_name().map(|n| n.to_owned()).unwrap_or_default();
        copy(&page, &man1.join(&name), 0o644)?;
        // -n: no name or time stamp inside, so the package is reproducible.
        util::status(Command::new("gzip").args(["-9nf"]).arg(man1.join(&name)))?;
    }
    let completions = gen_dir.join("completions");
    for (file, dest) in [
        (
            "energy-bpf.bash",
            "usr/share/bash-completion/completions/energy-bpf",
        ),
        (
            "_energy-bpf",
            "usr/share/zsh/vendor-completions/_energy-bpf",
        ),
        (
            "energy-bpf.fish",
            "usr/share/fish/vendor_completions.d/energy-bpf.fish",
        ),
    ] {
        copy(&completions.join(file), &stage.join(dest), 0o644)?;
    }

    // The unit runs the packaged binary, and members of `energy-bpf` may read its socket.
    let packaging = util::root().join("packaging");
    let unit = std::fs::read_to_string(packaging.join("energy-bpf-agent.service"))
        .map_err(|e| format!("packaging/energy-bpf-agent.service: {e}"))?
        .replace("/usr/local/bin/energy-bpf", "/usr/bin/energy-bpf")
        .replace(
            "# Install: copy the binary to /usr/local/bin, this file to /etc/systemd/system/, then\n",
            "# Installed by the energy-bpf package; enable it with\n",
        )
        .replace("#SupplementaryGroups=energy-bpf", "SupplementaryGroups=energy-bpf");
    write(
        &stage.join("lib/systemd/system/energy-bpf-agent.service"),
        &unit,
        0o644,
    )?;
    copy(
        &packaging.join("agent.toml"),
        &stage.join("etc/energy-bpf/agent.toml"),
        0o644,
    )?;

    // The copyright file (machine-readable, DEP-5), a changelog, and the lintian
    // overrides, each with its reason.
    let doc = stage.join("usr/share/doc/energy-bpf");
    write(&doc.join("copyright"), COPYRIGHT, 0o644)?;
    write(
        &doc.join("changelog"),
        &format!(
            "energy-bpf ({version}) unstable; urgency=medium\n\n  * Release {version}; the \
             project's history is in its git log.\n\n -- {MAINTAINER}  Sat, 28 Nov 2026 00:00:00 \
             +0000\n"
        ),
        0o644,
    )?;
    util::status(
        Command::new("gzip")
            .args(["-9nf"])
            .arg(doc.join("changelog")),
    )?;
    write(
        &stage.join("usr/share/lintian/overrides/energy-bpf"),
        LINTIAN_OVERRIDES,
        0o644,
    )?;

    let installed_kib = util::output("du", &["-sk", &stage.display().to_string()])
        .and_then(|o| o.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "0".into());
    let control = format!(
        "Package: energy-bpf\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: {MAINTAINER}\n\
         Installed-Size: {installed_kib}\n\
         Depends: libc6, libgcc-s1, procps\n\
         Recommends: systemd\n\
         Section: utils\n\
         Priority: optional\n\
         Description: system-wide energy profiler (eBPF)\n \
         Which code burned these joules? eBPF probes record which thread ran on each\n \
         CPU and its stacks; the machine's energy counters (RAPL, hwmon, NVML, or a\n \
         model labelled estimated) are split over the threads, processes and functions\n \
         that spent them. Includes `top`, `record`, `report`, `flamegraph`, `diff` and\n \
         an always-on agent with Prometheus metrics (energy-bpf-agent.service).\n"
    );
    write(&stage.join("DEBIAN/control"), &control, 0o644)?;
    write(
        &stage.join("DEBIAN/conffiles"),
        "/etc/energy-bpf/agent.toml\n",
        0o644,
    )?;
    write(&stage.join("DEBIAN/postinst"), POSTINST, 0o755)?;
    write(&stage.join("DEBIAN/prerm"), PRERM, 0o755)?;
    write(&stage.join("DEBIAN/postrm"), POSTRM, 0o755)?;

    let deb = out.join(format!("energy-bpf_{version}_{arch}.deb"));
    util::status(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    Ok(deb)
}

/// The package's maintainer field. The project has no mail domain of its own yet (see
/// `LINTIAN_OVERRIDES`).
const MAINTAINER: &str = "energy-bpf developers <energy-bpf@invalid>";

/// Creates the group whose members may read the agent's socket, and enables the unit
/// without starting it (the agent loads eBPF on every CPU: starting it is the admin's
/// decision, `systemctl start energy-bpf-agent`). `deb-systemd-helper` works in a chroot
/// and without a running systemd.
const POSTINST: &str = "#!/bin/sh
set -e
if [ \"$1\" = configure ]; then
    if ! getent group energy-bpf >/dev/null; then
        groupadd --system energy-bpf
    fi
    if command -v deb-systemd-helper >/dev/null; then
        if deb-systemd-helper --quiet was-enabled energy-bpf-agent.service; then
            deb-systemd-helper enable energy-bpf-agent.service >/dev/null || true
        else
            deb-systemd-helper update-state energy-bpf-agent.service >/dev/null || true
            deb-systemd-helper enable energy-bpf-agent.service >/dev/null || true
        fi
    fi
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
    fi
fi
exit 0
";

/// Stops the agent before its binary goes away.
const PRERM: &str = "#!/bin/sh
set -e
if [ \"$1\" = remove ] && [ -d /run/systemd/system ] && command -v deb-systemd-invoke >/dev/null; then
    deb-systemd-invoke stop energy-bpf-agent.service >/dev/null || true
fi
exit 0
";

/// Forgets the unit after removal; a purge also removes its enablement and the agent's
/// state. The group stays (Debian leaves system groups in place: files may still carry
/// its id).
const POSTRM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
if [ \"$1\" = remove ] && command -v deb-systemd-helper >/dev/null; then
    deb-systemd-helper mask energy-bpf-agent.service >/dev/null || true
fi
if [ \"$1\" = purge ]; then
    if command -v deb-systemd-helper >/dev/null; then
        deb-systemd-helper purge energy-bpf-agent.service >/dev/null || true
        deb-systemd-helper unmask energy-bpf-agent.service >/dev/null || true
    fi
    rm -rf /var/lib/energy-bpf
fi
exit 0
";

/// `usr/share/doc/energy-bpf/copyright`, machine-readable (DEP-5).
const COPYRIGHT: &str = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: energy-bpf
Source: https://example.invalid/energy-bpf

Files: *
Copyright: 2026 energy-bpf developers
License: MIT or Apache-2.0

License: MIT
 Permission is hereby granted, free of charge, to any person obtaining a copy
 of this software and associated documentation files (the \"Software\"), to deal
 in the Software without restriction, including without limitation the rights
 to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
 copies of the Software, and to permit persons to whom the Software is
 furnished to do so, subject to the following conditions:
 .
 The above copyright notice and this permission notice shall be included in all
 copies or substantial portions of the Software.
 .
 THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
 IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
 FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
 AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
 LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
 OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
 SOFTWARE.

License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
";

/// Lintian tags the package overrides, each with why.
const LINTIAN_OVERRIDES: &str =
    "# The project has no mail domain of its own yet; the address is deliberately in .invalid
# (RFC 2606) so that no mail goes to someone else's domain.
energy-bpf: bogus-mail-host Maintainer *
energy-bpf: bogus-mail-host-in-debian-changelog *
";

/// Runs `cmd` in the Debian root `root`.
fn chroot(root: &Path, cmd: &[&str]) -> Result<String> {
    let out = Command::new("chroot")
        .arg(root)
        .args(cmd)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|e| format!("cannot run chroot: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("in the Debian root: {cmd:?} failed: {text}"))
    }
}

fn check(ok: bool, what: &str) -> Result {
    if ok {
        Ok(())
    } else {
        Err(format!("install test: {what}"))
    }
}

/// Installs `deb` into a minbase Debian root and checks it (see the module's doc).
fn install_test(deb: &Path, out: &Path) -> Result {
    let suite = suite();
    let root = out.join(format!("debootstrap-{suite}"));
    // man-db for `man -w`, systemd for `systemd-analyze verify` inside the root.
    if !["usr/bin/dpkg", "usr/bin/man", "usr/bin/systemd-analyze"]
        .iter()
        .all(|f| root.join(f).exists())
    {
        if util::output("debootstrap", &["--version"]).is_none() {
            util::status(Command::new("apt-get").args(["install", "-y", "debootstrap"]))?;
        }
        let _ = std::fs::remove_dir_all(&root);
        util::status(
            Command::new("debootstrap")
                .args(["--variant=minbase", "--include=man-db,systemd", &suite])
                .arg(&root),
        )?;
    }
    // A fresh install each time: whatever an earlier run left is purged first.
    let _ = chroot(&root, &["dpkg", "--purge", "energy-bpf"]);
    let _ = chroot(&root, &["groupdel", "energy-bpf"]);
    std::fs::copy(deb, root.join("tmp/energy-bpf.deb")).map_err(|e| e.to_string())?;
    // As a user installs a downloaded package: apt resolves its dependencies.
    chroot(&root, &["apt-get", "install", "-y", "/tmp/energy-bpf.deb"])?;

    let version = chroot(&root, &["energy-bpf", "--version"])?;
    check(
        version.starts_with("energy-bpf "),
        "energy-bpf --version runs",
    )?;
    chroot(&root, &["energy-bpf", "report", "--help"])?;
    for file in [
        "usr/bin/energy-bpf",
        "usr/share/man/man1/energy-bpf.1.gz",
        "usr/share/man/man1/energy-bpf-record.1.gz",
        "usr/share/man/man1/energy-bpf-agent.1.gz",
        "usr/share/bash-completion/completions/energy-bpf",
        "usr/share/zsh/vendor-completions/_energy-bpf",
        "usr/share/fish/vendor_completions.d/energy-bpf.fish",
        "lib/systemd/system/energy-bpf-agent.service",
        "etc/energy-bpf/agent.toml",
    ] {
        check(root.join(file).exists(), &format!("/{file} installed"))?;
    }
    chroot(
        &root,
        &["gzip", "-t", "/usr/share/man/man1/energy-bpf-record.1.gz"],
    )?;
    let page = chroot(&root, &["man", "-w", "energy-bpf-record"])?;
    check(
        page.trim() == "/usr/share/man/man1/energy-bpf-record.1.gz",
        &format!("man -w energy-bpf-record finds the page (got {page:?})"),
    )?;
    chroot(
        &root,
        &[
            "systemd-analyze",
            "verify",
            "/lib/systemd/system/energy-bpf-agent.service",
        ],
    )?;
    check(
        root.join("etc/systemd/system/multi-user.target.wants/energy-bpf-agent.service")
            .is_symlink(),
        "the unit is enabled (not started: no systemd runs in the root)",
    )?;
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/energy-bpf-agent.service"))
        .map_err(|e| e.to_string())?;
    check(
        unit.contains("ExecStart=/usr/bin/energy-bpf agent --config /etc/energy-bpf/agent.toml"),
        "the unit runs the packaged binary with the packaged config",
    )?;
    chroot(&root, &["getent", "group", "energy-bpf"])?;
    let conffiles = chroot(
        &root,
        &["dpkg-query", "-W", "-f=${Conffiles}", "energy-bpf"],
    )?;
    check(
        conffiles.contains("/etc/energy-bpf/agent.toml"),
        "agent.toml is a conffile",
    )?;

    // A local change to the conffile survives reinstalling the package.
    let conf = root.join("etc/energy-bpf/agent.toml");
    let mut edited = std::fs::read_to_string(&conf).map_err(|e| e.to_string())?;
    edited.push_str("# changed here\n");
    std::fs::write(&conf, &edited).map_err(|e| e.to_string())?;
    chroot(
        &root,
        &["dpkg", "-i", "--force-confold", "/tmp/energy-bpf.deb"],
    )?;
    check(
        std::fs::read_to_string(&conf).map_err(|e| e.to_string())? == edited,
        "a local change to agent.toml survives a reinstall",
    )?;

    // dpkg -r leaves nothing of the package but its conffile; a purge removes that too.
    let listed = chroot(&root, &["dpkg", "-L", "energy-bpf"])?;
    chroot(&root, &["dpkg", "-r", "energy-bpf"])?;
    let left: Vec<&str> = listed
        .lines()
        .filter(|f| {
            let path = root.join(f.trim_start_matches('/'));
            // Files and links to files (not /lib, a link to a directory here).
            (path.is_file() || path.is_symlink()) && !path.is_dir()
        })
        .collect();
    check(
        left == ["/etc/energy-bpf/agent.toml"],
        &format!("dpkg -r leaves only the conffile (left: {left:?})"),
    )?;
    chroot(&root, &["dpkg", "--purge", "energy-bpf"])?;
    check(
        !root.join("usr/bin/energy-bpf").exists() && !conf.exists(),
        "a purge removes the binary and the conffile",
    )?;
    check(
        !root
            .join("etc/systemd/system/multi-user.target.wants/energy-bpf-agent.service")
            .exists(),
        "a purge removes the unit's enablement",
    )?;
    Ok(())
}
