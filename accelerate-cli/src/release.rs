//! Which accelerate release `accel` imitates: the one installed where the
//! training script will run.
//!
//! accelerate's launcher changes between releases (a variable stops being
//! exported, a default changes, flags come and go), and a user expects
//! `accel launch` to do what the `accelerate launch` *they have* does. So
//! every difference between the releases accel supports is one field of
//! [`Behaviour`], and [`RELEASES`] is the one table that says which release
//! behaves how; the launcher, the questionnaire and the flag parser read
//! those fields and never compare versions themselves.
//!
//! The installed version is found without starting Python
//! ([`installed`]): `accel launch` starts in milliseconds where `accelerate
//! launch` spends a second importing torch, and a Python start would cost
//! most of that. A release newer than the table runs with the newest known
//! behaviour and a warning naming it; one older than the oldest supported
//! (1.10) runs with the oldest known behaviour and a warning that it is not
//! supported; with no accelerate installed, accel behaves as the newest
//! release, silently (there is nothing to disagree with).

pub mod installed;

use std::fmt;

use crate::launch::flags::Dest;

/// A release number: `major.minor.patch` (a pre-release or dev suffix is
/// dropped: `1.17.0.dev0` behaves as 1.17.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch (0 when the text has none).
    pub patch: u32,
}

impl Version {
    /// `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Reads `1.16.0`, `1.10`, `1.17.0rc1`, `1.17.0.dev0`; `None` for text
    /// that does not start with two dot-separated numbers.
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = [0u32; 3];
        let mut count = 0;
        for piece in text.split('.').take(3) {
            let digits: String = piece.chars().take_while(char::is_ascii_digit).collect();
            if digits.is_empty() {
                break;
            }
            parts[count] = digits.parse().ok()?;
            count += 1;
            if digits.len() != piece.len() {
                break; // a suffix (`0rc1`): the number ends here
            }
        }
        (count >= 2).then(|| Version::new(parts[0], parts[1], parts[2]))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// When the simple launcher (one process) exports `KMP_AFFINITY` and
/// `KMP_BLOCKTIME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmpVars {
    /// Always: accelerate tested the text `"False"`, which Python finds true (< 1.13).
    Always,
    /// Never: accelerate looked the text up as a variable name (1.13, 1.14).
    Never,
    /// On CPU only (`ACCELERATE_USE_CPU` true), as intended (1.15 and later).
    OnCpu,
}

/// What `--num_processes` defaults to without a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessDefault {
    /// The number of GPUs, 0 on a machine without (< 1.16): `--cpu` then
    /// gets no thread hint and `OMP_NUM_THREADS=1`.
    Devices,
    /// At least 1, and 1 under `--cpu` whatever the GPUs (1.16 and later):
    /// `--cpu` then spreads the physical cores over that one process.
    AtLeastOne,
}

/// Everything accel does differently for one range of accelerate releases.
#[derive(Debug, PartialEq, Eq)]
pub struct Behaviour {
    /// The first release of the range (it ends where the next row starts).
    pub since: Version,
    /// `KMP_AFFINITY`/`KMP_BLOCKTIME` from the simple launcher.
    pub kmp_vars: KmpVars,
    /// `--num_processes` without a file.
    pub process_default: ProcessDefault,
    /// The simple launcher exports `CCL_WORKER_COUNT` for several processes
    /// or machines (< 1.13).
    pub ccl_worker_count: bool,
    /// `--dynamo_use_dynamic` defaults to "not given" and
    /// `ACCELERATE_DYNAMO_USE_DYNAMIC` is exported only when given (1.16 and
    /// later); before, it defaults to false and is always exported.
    pub dynamo_dynamic_optional: bool,
    /// `--fsdp_min_num_params` defaults to the float `1e8` (exported as
    /// `100000000.0`; < 1.13) rather than the integer.
    pub fsdp_min_num_params_float: bool,
    /// The `PARALLELISM_CONFIG_*` set includes the context-parallel backend
    /// and the sequence-parallel variables, and DeepSpeed launches export it
    /// too (1.12 and later).
    pub parallelism_sequence: bool,
    /// A configuration file's `dynamo_config` keys without the `dynamo_`
    /// prefix are read with it (1.14 and later).
    pub dynamo_config_prefix: bool,
    /// accel's flags (accelerate 1.15's set) that this release does not
    /// have: refused when given, and never exported.
    pub absent_flags: &'static [Dest],
    /// The questionnaire asks about Intel's IPEX on CPU, and for mpirun's
    /// oneCCL worker count (< 1.13).
    pub ipex_questions: bool,
    /// The questionnaire's device-ids question names the devices after the
    /// accelerator found ("CPU(s)" without one; 1.16 and later) rather
    /// than always "GPU(s)".
    pub ids_named_by_accelerator: bool,
    /// The FP8 backends the questionnaire offers, in its order.
    pub fp8_backends: &'static [&'static str],
    /// `notebook_launcher` passes the precision as `MIXED_PRECISION` (< 1.16;
    /// later as `ACCELERATE_MIXED_PRECISION`). The Python launchers run
    /// without this binary, so `python/accel/launchers.py` keeps the same
    /// threshold; a test here checks that it does.
    pub notebook_plain_mixed_precision: bool,
}

use Dest as D;

/// Flags that came with accelerate 1.12 (sequence parallelism).
const SINCE_1_12: &[Dest] = &[
    D::parallelism_config_cp_backend,
    D::parallelism_config_sp_size,
    D::parallelism_config_sp_backend,
    D::parallelism_config_sp_seq_length,
    D::parallelism_config_sp_seq_length_is_variable,
    D::parallelism_config_sp_attn_implementation,
];

/// Flags that came with 1.13 (Megatron-LM's new settings, torchao's FP8).
const SINCE_1_13: &[Dest] = &[
    D::megatron_lm_use_custom_fsdp,
    D::megatron_lm_no_load_optim,
    D::megatron_lm_eod_mask_loss,
    D::megatron_lm_overlap_cpu_optimizer_d2h_h2d,
    D::megatron_lm_no_save_optim,
    D::megatron_lm_optimizer_cpu_offload,
    D::megatron_lm_use_precision_aware_optimizer,
    D::megatron_lm_decoder_last_pipeline_num_layers,
    D::megatron_lm_recompute_granularity,
    D::megatron_lm_recompute_method,
    D::megatron_lm_recompute_num_layers,
    D::megatron_lm_attention_backend,
    D::megatron_lm_expert_model_parallel_size,
    D::megatron_lm_context_parallel_size,
    D::megatron_lm_attention_dropout,
    D::megatron_lm_hidden_dropout,
    D::megatron_lm_attention_softmax_in_fp32,
    D::megatron_lm_expert_tensor_parallel_size,
    D::megatron_lm_calculate_per_token_loss,
    D::megatron_lm_use_rotary_position_embeddings,
    D::fp8_enable_fsdp_float8_all_gather,
    D::fp8_pad_inner_dim,
];

/// Flags that 1.13 removed (deprecated and ignored before).
const UNTIL_1_13: &[Dest] = &[D::use_xpu, D::mpirun_ccl];

/// Macro-free concatenation of the flag lists a row lacks.
const ABSENT_1_10: &[Dest] = &concat::<{ SINCE_1_12.len() + SINCE_1_13.len() + 1 }>(
    SINCE_1_12,
    SINCE_1_13,
    &[D::fsdp_activation_checkpointing_offload],
);
const ABSENT_1_12: &[Dest] = &concat::<{ SINCE_1_13.len() + 1 }>(
    &[],
    SINCE_1_13,
    &[D::fsdp_activation_checkpointing_offload],
);
const ABSENT_1_13: &[Dest] = &concat::<{ UNTIL_1_13.len() + 1 }>(
    &[],
    UNTIL_1_13,
    &[D::fsdp_activation_checkpointing_offload],
);
const ABSENT_1_16: &[Dest] =
    &concat::<{ UNTIL_1_13.len() + 1 }>(&[], UNTIL_1_13, &[D::fp8_opt_level]);

const fn concat<const N: usize>(a: &[Dest], b: &[Dest], c: &[Dest]) -> [Dest; N] {
    let mut out = [D::config_file; N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < b.len() {
        out[i + j] = b[j];
        j += 1;
    }
    let mut k = 0;
    while k < c.len() {
        out[i + j + k] = c[k];
        k += 1;
    }
    out
}

/// Every supported range, oldest first: a row holds from its `since` until
/// the next row's. 1.10.x and 1.11.x behave alike (1.11 fixed typos only).
pub const RELEASES: &[Behaviour] = &[
    Behaviour {
        since: Version::new(1, 10, 0),
        kmp_vars: KmpVars::Always,
        ccl_worker_count: true,
        process_default: ProcessDefault::Devices,
        dynamo_dynamic_optional: false,
        fsdp_min_num_params_float: true,
        parallelism_sequence: false,
        dynamo_config_prefix: false,
        absent_flags: ABSENT_1_10,
        ipex_questions: true,
        ids_named_by_accelerator: false,
        fp8_backends: &["te", "msamp"],
        notebook_plain_mixed_precision: true,
    },
    Behaviour {
        since: Version::new(1, 12, 0),
        kmp_vars: KmpVars::Always,
        ccl_worker_count: true,
        process_default: ProcessDefault::Devices,
        dynamo_dynamic_optional: false,
        fsdp_min_num_params_float: true,
        parallelism_sequence: true,
        dynamo_config_prefix: false,
        absent_flags: ABSENT_1_12,
        ipex_questions: true,
        ids_named_by_accelerator: false,
        fp8_backends: &["te", "msamp"],
        notebook_plain_mixed_precision: true,
    },
    Behaviour {
        since: Version::new(1, 13, 0),
        kmp_vars: KmpVars::Never,
        ccl_worker_count: false,
        process_default: ProcessDefault::Devices,
        dynamo_dynamic_optional: false,
        fsdp_min_num_params_float: false,
        parallelism_sequence: true,
        dynamo_config_prefix: false,
        absent_flags: ABSENT_1_13,
        ipex_questions: false,
        ids_named_by_accelerator: false,
        fp8_backends: &["ao", "te", "msamp"],
        notebook_plain_mixed_precision: true,
    },
    Behaviour {
        since: Version::new(1, 14, 0),
        kmp_vars: KmpVars::Never,
        ccl_worker_count: false,
        process_default: ProcessDefault::Devices,
        dynamo_dynamic_optional: false,
        fsdp_min_num_params_float: false,
        parallelism_sequence: true,
        dynamo_config_prefix: true,
        absent_flags: ABSENT_1_13,
        ipex_questions: false,
        ids_named_by_accelerator: false,
        fp8_backends: &["ao", "te", "msamp"],
        notebook_plain_mixed_precision: true,
    },
    Behaviour {
        since: Version::new(1, 15, 0),
        kmp_vars: KmpVars::OnCpu,
        ccl_worker_count: false,
        process_default: ProcessDefault::Devices,
        dynamo_dynamic_optional: false,
        fsdp_min_num_params_float: false,
        parallelism_sequence: true,
        dynamo_config_prefix: true,
        absent_flags: UNTIL_1_13,
        ipex_questions: false,
        ids_named_by_accelerator: false,
        fp8_backends: &["ao", "te", "msamp"],
        notebook_plain_mixed_precision: true,
    },
    Behaviour {
        since: Version::new(1, 16, 0),
        kmp_vars: KmpVars::OnCpu,
        ccl_worker_count: false,
        process_default: ProcessDefault::AtLeastOne,
        dynamo_dynamic_optional: true,
        fsdp_min_num_params_float: false,
        parallelism_sequence: true,
        dynamo_config_prefix: true,
        absent_flags: ABSENT_1_16,
        ipex_questions: false,
        ids_named_by_accelerator: true,
        fp8_backends: &["ao", "te"],
        notebook_plain_mixed_precision: false,
    },
];

/// The newest release whose behaviour the table knows; anything newer gets a warning.
pub const NEWEST_KNOWN: Version = Version::new(1, 16, 0);

/// The release the behaviour is taken from, and the installed version it was
/// chosen for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// The installed accelerate (`None`: none was found).
    pub installed: Option<Version>,
    /// Its row of [`RELEASES`].
    pub behaviour: &'static Behaviour,
}

impl Release {
    /// The behaviour for an installed version (`None`: the newest known).
    pub fn of(installed: Option<Version>) -> Release {
        let newest = &RELEASES[RELEASES.len() - 1];
        let behaviour = match installed {
            None => newest,
            Some(v) => RELEASES
                .iter()
                .rev()
                .find(|row| row.since <= v)
                .unwrap_or(&RELEASES[0]),
        };
        Release {
            installed,
            behaviour,
        }
    }

    /// The behaviour of exactly `major.minor.patch` (tests, benchmarks).
    pub fn version(major: u32, minor: u32, patch: u32) -> Release {
        Release::of(Some(Version::new(major, minor, patch)))
    }

    /// The release installed for `env`'s interpreter ([`installed::find`]).
    pub fn installed(env: &dyn Fn(&str) -> Option<String>) -> Release {
        Release::of(installed::find(env).map(|found| found.version))
    }

    /// What to tell the user once: a release newer than the table, or older
    /// than the oldest supported.
    pub fn warning(&self) -> Option<String> {
        let v = self.installed?;
        let next_minor = Version::new(NEWEST_KNOWN.major, NEWEST_KNOWN.minor + 1, 0);
        if v >= next_minor {
            Some(format!(
                "accelerate {v} is newer than the releases accel knows (1.10 to {}.{}); accel behaves as accelerate {NEWEST_KNOWN}, so a launch may differ from `accelerate launch` where {v} changed something",
                NEWEST_KNOWN.major, NEWEST_KNOWN.minor
            ))
        } else if v < RELEASES[0].since {
            Some(format!(
                "accelerate {v} is older than the oldest release accel supports (1.10); accel behaves as accelerate 1.10 — upgrade accelerate (pip install -U accelerate) for a launch that matches it"
            ))
        } else {
            None
        }
    }

    /// Whether this release has the flag.
    pub fn has_flag(&self, dest: Dest) -> bool {
        !self.behaviour.absent_flags.contains(&dest)
    }

    /// The version to name in messages: the installed one, else the row's.
    pub fn name(&self) -> Version {
        self.installed.unwrap_or(self.behaviour.since)
    }
}

#[cfg(test)]
mod tests;
