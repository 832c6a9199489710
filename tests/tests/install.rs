//! What an operator installs besides the binaries: shell completions that
//! a shell accepts, and man pages that list the flags.

use std::process::Command;

use accel_tests::bin;

fn run(program: &str, args: &[&str]) -> std::process::Output {
    Command::new(bin(program)).args(args).output().expect("run")
}

#[test]
fn bash_loads_every_binarys_completions() {
    for program in ["rdzv-server", "accel-agent", "accel"] {
        let out = run(program, &["completions", "bash"]);
        assert!(out.status.success(), "{program}: {out:?}");
        let script = std::env::temp_dir().join(format!(
            "accel-completions-{program}-{}",
            std::process::id()
        ));
        std::fs::write(&script, &out.stdout).expect("write");
        // Sourced by a real bash, the script registers a completion for the program.
        let check = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source '{}' && complete -p {program}",
                script.display()
            ))
            .output()
            .expect("bash");
        let _ = std::fs::remove_file(&script);
        let said = String::from_utf8_lossy(&check.stdout);
        assert!(
            check.status.success() && said.contains(program),
            "{program}: {check:?}"
        );
    }
    let out = run("accel-agent", &["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("use bash, zsh, fish, elvish or powershell")
    );
}

#[test]
fn man_pages_list_the_flags() {
    for (program, flag) in [
        ("rdzv-server", "metrics\\-bind"),
        ("accel-agent", "nproc\\-per\\-node"),
        ("accel-agent", "metrics\\-bind"),
        ("accel", "launch"),
    ] {
        let out = run(program, &["manpage"]);
        assert!(out.status.success(), "{program}: {out:?}");
        let page = String::from_utf8_lossy(&out.stdout);
        assert!(
            page.contains(&format!(".TH {program} 1")),
            "{program}: {page}"
        );
        assert!(page.contains(flag), "{program} lacks {flag}: {page}");
    }
}
