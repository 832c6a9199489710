use super::*;
use crate::yaml;

fn config(text: &str) -> AccelerateConfig {
    let (sagemaker, fields) =
        config_file::process(yaml::load(text).expect("yaml")).expect("valid config");
    AccelerateConfig {
        path: "cfg.yaml".into(),
        sagemaker,
        fields,
    }
}

fn host() -> Host {
    Host {
        platform: "Linux-6.1.0-x86_64".into(),
        ram: Some(25_275_990_016),
        location: Some("/usr/bin/accel".into()),
    }
}

fn fake_probe() -> probe::Probe {
    probe::parse(
        "ACCEL_ENV {\"python\": \"3.11.7\", \"platform\": \"Linux-6.1.0-x86_64-with-glibc2.36\", \
         \"accelerate\": \"1.15.0\", \"numpy\": \"2.4.6\", \"torch\": \"2.13.0\", \
         \"accelerator\": \"CUDA\", \"ram\": 25275990016, \"device\": [\"GPU type\", \"NVIDIA A100\"]}",
    )
    .expect("blob")
}

#[test]
fn layout_matches_accelerate_with_a_config() {
    // The file `accelerate env` (1.15.0) printed this section for, with the
    // nested keys reordered: they print in the file's order.
    let c = config(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\n\
         mixed_precision: 'no'\ngpu_ids: all\nfsdp_config:\n  fsdp_d: null\n  fsdp_a: 1.0e-05\n  \
         fsdp_b: [a, \"it's\"]\n  fsdp_c: {}\ntpu_env: [x, 'y']\n",
    );
    let text = render(&Facts::new(Ok(fake_probe()), &host()), Some(&c), false);
    let want = "\nCopy-and-paste the text below in your GitHub issue\n\n\
- `Accelerate` version: 1.15.0
- `accel` version: VERSION
- Platform: Linux-6.1.0-x86_64-with-glibc2.36
- `accel` location: /usr/bin/accel
- Python version: 3.11.7
- Numpy version: 2.4.6
- PyTorch version: 2.13.0
- PyTorch accelerator: CUDA
- System RAM: 23.54 GB
- GPU type: NVIDIA A100
- `Accelerate` default config:
\t- compute_environment: LOCAL_MACHINE
\t- distributed_type: MULTI_GPU
\t- mixed_precision: no
\t- use_cpu: False
\t- debug: False
\t- num_processes: 2
\t- machine_rank: 0
\t- num_machines: 1
\t- gpu_ids: all
\t- rdzv_backend: static
\t- same_network: False
\t- main_training_function: main
\t- enable_cpu_affinity: False
\t- fsdp_config: {'fsdp_d': None, 'fsdp_a': 1e-05, 'fsdp_b': ['a', \"it's\"], 'fsdp_c': None}
\t- downcast_bf16: False
\t- tpu_use_cluster: False
\t- tpu_use_sudo: False
\t- tpu_env: ['x', 'y']"
        .replace("VERSION", env!("CARGO_PKG_VERSION"));
    assert_eq!(text, want);
}

#[test]
fn without_python_nothing_fails() {
    let f = Facts::new(Err(None), &host());
    let text = render(&f, None, true);
    for line in [
        "- `Accelerate` version: not installed",
        "- Platform: Linux-6.1.0-x86_64",
        "- Python version: not installed",
        "- Numpy version: not installed",
        "- PyTorch version: not installed",
        "- PyTorch accelerator: N/A",
        "- System RAM: 23.54 GB",
        "- `Accelerate` config passed:",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
    }
    assert!(text.ends_with("config passed:\n\tNot found"), "{text}");
    assert!(!text.contains("GPU type"));

    let broken = Facts::new(Err(Some("python3 crashed".into())), &Host::default());
    let text = render(&broken, None, false);
    assert!(text.contains("- PyTorch version: unknown (python3 crashed)"));
    assert!(text.contains("- System RAM: N/A") && text.contains("- `accel` location: Not found"));
}

#[test]
fn a_missing_package_reads_not_installed() {
    let mut p = fake_probe();
    p.numpy = None;
    p.ram = None;
    let f = Facts::new(Ok(p), &host());
    assert!(f
        .lines
        .contains(&("Numpy version".into(), "not installed".into())));
    // psutil absent: the kernel's figure.
    assert!(f.lines.contains(&("System RAM".into(), "23.54 GB".into())));
}

#[test]
fn sagemaker_fields_in_their_class_order() {
    let c = config(
        "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\nmixed_precision: fp16\n\
         ec2_instance_type: ml.p3.2xlarge\niam_role_name: role\n",
    );
    let keys: Vec<String> = ordered(&c).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            "compute_environment",
            "distributed_type",
            "mixed_precision",
            "use_cpu",
            "debug",
            "ec2_instance_type",
            "iam_role_name",
            "region",
            "num_machines",
            "gpu_ids",
            "base_job_name",
            "pytorch_version",
            "transformers_version",
            "py_version",
            "enable_cpu_affinity",
        ]
    );
}

#[test]
fn meminfo() {
    assert_eq!(
        meminfo_total("MemTotal:       24683584 kB\nMemFree: 1 kB\n"),
        Some(24_683_584 * 1024)
    );
    assert_eq!(meminfo_total("nothing"), None);
}

#[test]
fn run_without_python_or_config() {
    let scratch = tempfile::tempdir().expect("scratch dir");
    let dir = scratch.path().to_path_buf();
    let hf = dir.to_string_lossy().into_owned();
    let env = move |k: &str| match k {
        "PYTHON_EXEC" => Some("/nonexistent/python".to_owned()),
        "HF_HOME" => Some(hf.clone()),
        _ => None,
    };
    let text = run(None, &env).expect("never fails without Python");
    assert!(text.contains("- PyTorch version: not installed"), "{text}");
    assert!(text.ends_with("- `Accelerate` default config:\n\tNot found"));
    let missing = run(Some(&dir.join("nope.yaml")), &env).expect_err("explicit file must exist");
    assert!(missing.to_string().contains("nope.yaml"), "{missing}");
}
