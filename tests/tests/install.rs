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

/// torchrun's `--print-completion {bash,zsh,tcsh}` (torch 2.14): a real
/// bash loads the script and completes `--nproc` to `--nproc-per-node`.
#[test]
fn print_completion_gives_torchruns_shells_a_working_script() {
    let out = run("accel-agent", &["--print-completion", "bash"]);
    assert!(out.status.success(), "{out:?}");
    let script =
        std::env::temp_dir().join(format!("accel-print-completion-{}", std::process::id()));
    std::fs::write(&script, &out.stdout).expect("write");
    let check = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source '{}' || exit 9
             f=$(complete -p accel-agent | awk '{{for (i = 1; i < NF; i++) if ($i == \"-F\") print $(i + 1)}}')
             COMP_WORDS=(accel-agent --nproc); COMP_CWORD=1
             COMP_LINE='accel-agent --nproc'; COMP_POINT=${{#COMP_LINE}}
             \"$f\" accel-agent --nproc accel-agent
             echo \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
        .output()
        .expect("bash");
    let _ = std::fs::remove_file(&script);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && said.split_whitespace().any(|w| w == "--nproc-per-node"),
        "{check:?}"
    );
    let zsh = run("accel-agent", &["--print-completion", "zsh"]);
    assert!(String::from_utf8_lossy(&zsh.stdout).starts_with("#compdef accel-agent"));
    let tcsh = run("accel-agent", &["--print-completion", "tcsh"]);
    let tcsh = String::from_utf8_lossy(&tcsh.stdout);
    assert!(
        tcsh.starts_with("complete accel-agent 'c/--/(") && tcsh.contains(" nproc-per-node "),
        "{tcsh}"
    );
    assert!(
        tcsh.contains("'n/--print-completion/(bash zsh tcsh)/'"),
        "{tcsh}"
    );
    let fish = run("accel-agent", &["--print-completion", "fish"]);
    assert_eq!(fish.status.code(), Some(2), "{fish:?}");
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
