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
    assert!(default_config("no", 0).contains("\"use_cpu\": true"));
    let four = default_config("bf16", 4);
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
    fn sagemaker_configs_load_without_num_processes() {
        let f = processed(
            "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\nec2_instance_type: ml.p3.2xlarge\niam_role_name: r\n",
        )
        .expect("loads");
        assert_eq!(f["region"], "us-east-1");
        assert!(!f.contains_key("num_processes"));
    }
}
