//! The fields of accelerate's configuration classes and their defaults
//! (`ClusterConfig` and `SageMakerConfig` in accelerate 1.15, plus the
//! `ipex_config` that 1.10-1.12 have), in the classes' order. A field whose default is `Required` must be in the file.

/// A field's default value, as a JSON literal (`null` for `None`, `{}` for
/// the dictionaries accelerate fills in after loading).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldDefault {
    /// The file must give it.
    Required,
    /// This JSON literal.
    Value(&'static str),
}

use FieldDefault::{Required, Value as V};

/// `ClusterConfig`, the local-machine configuration.
pub const CLUSTER_FIELDS: &[(&str, FieldDefault)] = &[
    ("compute_environment", Required),
    ("distributed_type", Required),
    ("mixed_precision", Required),
    ("use_cpu", Required),
    ("debug", Required),
    ("num_processes", V("-1")),
    ("machine_rank", V("0")),
    ("num_machines", V("1")),
    ("gpu_ids", V("null")),
    ("main_process_ip", V("null")),
    ("main_process_port", V("null")),
    ("rdzv_backend", V("\"static\"")),
    ("same_network", V("false")),
    ("main_training_function", V("\"main\"")),
    ("enable_cpu_affinity", V("false")),
    ("fp8_config", V("{}")),
    ("deepspeed_config", V("{}")),
    ("fsdp_config", V("{}")),
    ("parallelism_config", V("{}")),
    ("megatron_lm_config", V("{}")),
    // accelerate 1.10-1.12 (written by their questionnaire on CPU); later
    // releases refuse the key, accel reads it whatever the release.
    ("ipex_config", V("{}")),
    ("mpirun_config", V("{}")),
    ("downcast_bf16", V("false")),
    ("tpu_name", V("null")),
    ("tpu_zone", V("null")),
    ("tpu_use_cluster", V("false")),
    ("tpu_use_sudo", V("false")),
    ("command_file", V("null")),
    ("commands", V("null")),
    ("tpu_vm", V("null")),
    ("tpu_env", V("null")),
    ("dynamo_config", V("{}")),
];

/// `SageMakerConfig`, for Amazon SageMaker (read and written, not launched).
pub const SAGEMAKER_FIELDS: &[(&str, FieldDefault)] = &[
    ("compute_environment", Required),
    ("distributed_type", Required),
    ("mixed_precision", Required),
    ("use_cpu", Required),
    ("debug", Required),
    ("ec2_instance_type", Required),
    ("iam_role_name", Required),
    ("image_uri", V("null")),
    ("profile", V("null")),
    ("region", V("\"us-east-1\"")),
    ("num_machines", V("1")),
    ("gpu_ids", V("\"all\"")),
    ("base_job_name", V("\"accelerate-sagemaker-1\"")),
    ("pytorch_version", V("\"1.10.2\"")),
    ("transformers_version", V("\"4.17.0\"")),
    ("py_version", V("\"py38\"")),
    ("sagemaker_inputs_file", V("null")),
    ("sagemaker_metrics_file", V("null")),
    ("additional_args", V("null")),
    ("dynamo_config", V("{}")),
    ("enable_cpu_affinity", V("false")),
];

/// accelerate's `SageMakerDistributedType` values.
pub(super) const SAGEMAKER_DISTRIBUTED_TYPES: &[&str] = &["NO", "DATA_PARALLEL", "MODEL_PARALLEL"];
