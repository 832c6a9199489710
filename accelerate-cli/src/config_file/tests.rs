//! Locations, the default file, loading rules.

use super::*;

#[test]
fn locations_follow_accelerate() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    assert_eq!(
        default_location(&env(&[("HF_HOME", "/hf"), ("XDG_CACHE_HOME", "/x")])),
        Path::new("/hf/accelerate/default_config.yaml")
    );
    assert_eq!(
        default_location(&env(&[("XDG_CACHE_HOME", "/x")])),
        Path::new("/x/huggingface/accelerate/default_config.yaml")
    );
    assert_eq!(
        default_location(&env(&[("HOME", "/home/u")])),
        Path::new("/home/u/.cache/huggingface/accelerate/default_config.yaml")
    );
    assert_eq!(
        default_location(&env(&[("HOME", "/home/u"), ("HF_HOME", "~/hf")])),
        Path::new("/home/u/hf/accelerate/default_config.yaml")
    );
}

#[test]
fn device_counts() {
    assert!(default_config(MixedPrecision::No, 0).contains("\"use_cpu\": true"));
    let four = default_config(MixedPrecision::Bf16, 4);
    assert!(
        four.contains("\"distributed_type\": \"MULTI_GPU\"")
            && four.contains("\"num_processes\": 4")
    );
    assert!(four.contains("\"mixed_precision\": \"bf16\"") && four.contains("\"use_cpu\": false"));
    assert!(four.starts_with("{\n  \"compute_environment\": \"LOCAL_MACHINE\",\n"));
}

mod load {
    use super::*;

    fn processed(text: &str) -> Result<Map<String, Value>, String> {
        process(yaml::load(text).map_err(|e| e.to_string())?).map(|(_, f)| f)
    }

    #[test]
    fn legacy_keys_and_defaults() {
        let f = processed(
            "distributed_type: MULTI_GPU\nnum_processes: 2\nfp16: true\ndynamo_backend: INDUCTOR\n",
        )
        .expect("loads");
        assert_eq!(f["mixed_precision"], "fp16");
        assert_eq!(f["dynamo_config"], json!({"dynamo_backend": "INDUCTOR"}));
        assert_eq!(f["rdzv_backend"], "static");
        assert_eq!(f["fsdp_config"], json!({}));
        assert!(!f.contains_key("fp16"));
        let d = to_dict(&f);
        assert!(!d.contains_key("fsdp_config") && !d.contains_key("gpu_ids"));
        assert_eq!(d.len(), 16);
    }

    #[test]
    fn errors_name_the_problem() {
        let unknown = processed("distributed_type: 'NO'\nnum_proceses: 2\n").expect_err("unknown");
        assert!(unknown.contains("'num_proceses'"), "{unknown}");
        let boolean = processed("distributed_type: NO\n").expect_err("bool");
        assert!(boolean.contains("distributed_type: 'NO'"), "{boolean}");
        assert!(processed("num_processes: 2\n")
            .expect_err("missing")
            .contains("distributed_type"));
        assert!(processed("distributed_type: MULTI_TPU\n").is_err());

        assert!(processed("- a\n").is_err());
        let no = processed("distributed_type: 'NO'\n").expect("loads");
        assert_eq!(no["num_processes"], 1);
    }

    #[test]
    fn many_unknown_keys_are_named_briefly() {
        let mut text = String::from("distributed_type: 'NO'\n");
        for i in 0..5000 {
            text.push_str(&format!("k{i}{}: 1\n", "x".repeat(300)));
        }
        let e = processed(&text).expect_err("unknown");
        assert!(e.len() < 6000, "{} bytes", e.len());
        assert!(
            e.contains("and 4990 more") && e.contains("… (302 bytes)'"),
            "{e}"
        );
    }

    fn scratch(name: &str) -> PathBuf {
        tempfile::Builder::new()
            .prefix(&format!("accel-config-{name}-"))
            .tempdir()
            .expect("scratch")
            .keep()
    }

    #[test]
    fn files_over_1_mib_are_refused_unread() {
        let dir = scratch("size");
        let small = dir.join("small.yaml");
        // Exactly 1 MiB, padded with a YAML comment, still loads.
        let head = "distributed_type: 'NO'\n#";
        let pad = "x".repeat(MAX_CONFIG_BYTES as usize - head.len() - 1);
        std::fs::write(&small, format!("{head}{pad}\n")).expect("write");
        assert_eq!(
            std::fs::metadata(&small).expect("meta").len(),
            MAX_CONFIG_BYTES
        );
        load(&small).expect("1 MiB loads");
        let big = dir.join("big.yaml");
        std::fs::write(&big, format!("{head}{pad}x\n")).expect("write");
        let e = load(&big).expect_err("too large");
        assert!(
            matches!(
                e,
                LoadError::TooLarge {
                    size: Some(1_048_577),
                    ..
                }
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains("is 1048577 bytes; a configuration file may be at most 1 MiB"),
            "{text}"
        );
        // A sparse 8 GiB file is refused from its metadata, without reading.
        let sparse = dir.join("sparse.yaml");
        std::fs::File::create(&sparse)
            .and_then(|f| f.set_len(8 << 30))
            .expect("sparse");
        let started = std::time::Instant::now();
        assert!(matches!(load(&sparse), Err(LoadError::TooLarge { .. })));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        let binary = dir.join("binary.yaml");
        std::fs::write(&binary, b"a: \xff\n").expect("write");
        let e = load(&binary).expect_err("not text").to_string();
        assert!(e.contains("not UTF-8 text (byte 3)"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn sagemaker_configs_load_without_num_processes() {
        let f = processed(
            "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\nec2_instance_type: ml.p3.2xlarge\niam_role_name: r\n",
        )
        .expect("loads");
        assert_eq!(f["region"], "us-east-1");
        assert!(!f.contains_key("num_processes"));
        // A required key set to null is missing: accelerate takes it, then
        // cannot read the file `config update` writes (nulls are dropped).
        let e = processed(
            "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\nec2_instance_type: # none\niam_role_name: r\n",
        )
        .expect_err("null");
        assert_eq!(e, "missing required keys: ec2_instance_type");
        // A null mixed_precision is what a missing one reads as: kept.
        let f = processed("distributed_type: 'NO'\nmixed_precision: null\n").expect("loads");
        assert!(f["mixed_precision"].is_null());
    }
}

/// accelerate 1.10-1.12's questionnaire writes `ipex_config` on CPU; a file
/// from it loads, the key kept in its place for `accel env`.
#[test]
fn ipex_config_from_older_releases_loads() {
    let text =
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: 'no'\n\
                use_cpu: true\ndebug: false\nipex_config:\n  ipex: false\n";
    let (_, fields) = process(crate::yaml::load(text).expect("yaml")).expect("loads");
    assert_eq!(fields["ipex_config"], serde_json::json!({"ipex": false}));
    let keys: Vec<&String> = fields.keys().collect();
    let at = |k: &str| keys.iter().position(|x| *x == k).expect(k);
    assert_eq!(at("ipex_config") + 1, at("mpirun_config"));
}
