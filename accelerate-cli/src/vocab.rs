//! accelerate's vocabularies, each one enum: the distributed types, the
//! dynamo backends and the mixed-precision modes. The questionnaire, the
//! config-file reader and `accel launch` all take their names from here, so
//! a value accelerate adds is added once.
//!
//! The names are accelerate's, byte for byte, including one misspelling:
//! its questionnaire menu and its `launch --dynamo_backend` choices offer
//! `TORHCHXLA_TRACE_ONCE`, which is not a member of its `DynamoBackend` (it
//! crashes on it). accel offers the same spelling: the questionnaire writes
//! the backend meant ([`DynamoBackend::TorchxlaTraceOnce`]), and `accel
//! launch` refuses the misspelt value with a message listing the real names
//! (where accelerate raises), since no backend has that name.

/// accelerate's `DistributedType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DistributedType {
    /// One process.
    No,
    /// Several CPU processes.
    MultiCpu,
    /// Several GPUs.
    MultiGpu,
    /// Several Ascend NPUs.
    MultiNpu,
    /// Several Cambricon MLUs.
    MultiMlu,
    /// Several Tecorigin SDAAs.
    MultiSdaa,
    /// Several Moore Threads MUSA devices.
    MultiMusa,
    /// Several Intel XPUs.
    MultiXpu,
    /// DeepSpeed.
    DeepSpeed,
    /// PyTorch FSDP.
    Fsdp,
    /// TPUs through torch_xla.
    Xla,
    /// Megatron-LM.
    MegatronLm,
    /// Several Gaudi HPUs.
    MultiHpu,
    /// Several AWS Neuron cores.
    MultiNeuron,
}

impl DistributedType {
    /// Every type, in accelerate's order (config-file errors list them so).
    pub const ALL: [Self; 14] = [
        Self::No,
        Self::MultiCpu,
        Self::MultiGpu,
        Self::MultiNpu,
        Self::MultiMlu,
        Self::MultiSdaa,
        Self::MultiMusa,
        Self::MultiXpu,
        Self::DeepSpeed,
        Self::Fsdp,
        Self::Xla,
        Self::MegatronLm,
        Self::MultiHpu,
        Self::MultiNeuron,
    ];

    /// The name written to `distributed_type`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::No => "NO",
            Self::MultiCpu => "MULTI_CPU",
            Self::MultiGpu => "MULTI_GPU",
            Self::MultiNpu => "MULTI_NPU",
            Self::MultiMlu => "MULTI_MLU",
            Self::MultiSdaa => "MULTI_SDAA",
            Self::MultiMusa => "MULTI_MUSA",
            Self::MultiXpu => "MULTI_XPU",
            Self::DeepSpeed => "DEEPSPEED",
            Self::Fsdp => "FSDP",
            Self::Xla => "XLA",
            Self::MegatronLm => "MEGATRON_LM",
            Self::MultiHpu => "MULTI_HPU",
            Self::MultiNeuron => "MULTI_NEURON",
        }
    }

    /// The type named `name` exactly (accelerate's names are upper case).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The multi-accelerator types: `accel launch` runs them with the
    /// multi-GPU launcher, and the questionnaire asks them about DeepSpeed,
    /// FSDP and device ids.
    pub const fn is_multi_device(self) -> bool {
        matches!(
            self,
            Self::MultiGpu
                | Self::MultiNpu
                | Self::MultiMlu
                | Self::MultiSdaa
                | Self::MultiMusa
                | Self::MultiXpu
                | Self::MultiHpu
                | Self::MultiNeuron
        )
    }
}

/// accelerate's `DynamoBackend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamoBackend {
    /// No compilation.
    No,
    /// `eager`.
    Eager,
    /// `aot_eager`.
    AotEager,
    /// `inductor`.
    Inductor,
    /// `aot_ts_nvfuser`.
    AotTsNvfuser,
    /// `nvprims_nvfuser`.
    NvprimsNvfuser,
    /// `cudagraphs`.
    Cudagraphs,
    /// `ofi`.
    Ofi,
    /// `fx2trt`.
    Fx2trt,
    /// `onnxrt`.
    Onnxrt,
    /// `tensorrt`.
    Tensorrt,
    /// `aot_torchxla_trace_once`.
    AotTorchxlaTraceOnce,
    /// `torchxla_trace_once` (offered as `torhchxla_trace_once`).
    TorchxlaTraceOnce,
    /// `tvm`.
    Tvm,
    /// Gaudi's backend.
    HpuBackend,
    /// AWS Neuron's backend.
    Neuron,
}

impl DynamoBackend {
    /// Every backend, in accelerate's order (`ACCELERATE_DYNAMO_BACKEND`
    /// takes these names).
    pub const ALL: [Self; 16] = [
        Self::No,
        Self::Eager,
        Self::AotEager,
        Self::Inductor,
        Self::AotTsNvfuser,
        Self::NvprimsNvfuser,
        Self::Cudagraphs,
        Self::Ofi,
        Self::Fx2trt,
        Self::Onnxrt,
        Self::Tensorrt,
        Self::AotTorchxlaTraceOnce,
        Self::TorchxlaTraceOnce,
        Self::Tvm,
        Self::HpuBackend,
        Self::Neuron,
    ];

    /// The questionnaire's menu, in accelerate's order.
    pub const MENU: [Self; 13] = [
        Self::Eager,
        Self::AotEager,
        Self::Inductor,
        Self::AotTsNvfuser,
        Self::NvprimsNvfuser,
        Self::Cudagraphs,
        Self::Ofi,
        Self::Fx2trt,
        Self::Onnxrt,
        Self::Tensorrt,
        Self::AotTorchxlaTraceOnce,
        Self::TorchxlaTraceOnce,
        Self::Tvm,
    ];

    /// `accel launch --dynamo_backend`'s choices: `no`, then the menu's
    /// names in lower case (a `const` table for the flag table; a test
    /// checks it against [`Self::MENU`]).
    pub const LAUNCH_CHOICES: [&'static str; 14] = [
        "no",
        "eager",
        "aot_eager",
        "inductor",
        "aot_ts_nvfuser",
        "nvprims_nvfuser",
        "cudagraphs",
        "ofi",
        "fx2trt",
        "onnxrt",
        "tensorrt",
        "aot_torchxla_trace_once",
        "torhchxla_trace_once",
        "tvm",
    ];

    /// The backend's name (`INDUCTOR`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::No => "NO",
            Self::Eager => "EAGER",
            Self::AotEager => "AOT_EAGER",
            Self::Inductor => "INDUCTOR",
            Self::AotTsNvfuser => "AOT_TS_NVFUSER",
            Self::NvprimsNvfuser => "NVPRIMS_NVFUSER",
            Self::Cudagraphs => "CUDAGRAPHS",
            Self::Ofi => "OFI",
            Self::Fx2trt => "FX2TRT",
            Self::Onnxrt => "ONNXRT",
            Self::Tensorrt => "TENSORRT",
            Self::AotTorchxlaTraceOnce => "AOT_TORCHXLA_TRACE_ONCE",
            Self::TorchxlaTraceOnce => "TORCHXLA_TRACE_ONCE",
            Self::Tvm => "TVM",
            Self::HpuBackend => "HPU_BACKEND",
            Self::Neuron => "NEURON",
        }
    }

    /// The name accelerate's menus show for it (its misspelling included).
    pub const fn offered_name(self) -> &'static str {
        match self {
            Self::TorchxlaTraceOnce => "TORHCHXLA_TRACE_ONCE",
            other => other.name(),
        }
    }

    /// The backend named `name`, in any case (not the offered misspelling).
    pub fn parse(name: &str) -> Option<Self> {
        let upper = name.to_ascii_uppercase();
        Self::ALL.into_iter().find(|b| b.name() == upper)
    }
}

/// accelerate's mixed-precision modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixedPrecision {
    /// Full precision.
    No,
    /// float16.
    Fp16,
    /// bfloat16.
    Bf16,
    /// float8 (with an fp8 backend's settings).
    Fp8,
}

impl MixedPrecision {
    /// Every mode, in the order accelerate's menu and `--mixed_precision`
    /// choices list them.
    pub const ALL: [Self; 4] = [Self::No, Self::Fp16, Self::Bf16, Self::Fp8];

    /// `--mixed_precision`'s choices (a `const` table for the flag table; a
    /// test checks it against [`Self::ALL`]).
    pub const CHOICES: [&'static str; 4] = ["no", "fp16", "bf16", "fp8"];

    /// The modes `config default --mixed_precision` offers: accelerate
    /// writes no fp8 recipe there, so it does not offer fp8.
    pub const CONFIG_DEFAULT: [Self; 3] = [Self::No, Self::Fp16, Self::Bf16];

    /// The mode's name (`bf16`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::No => "no",
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
        }
    }

    /// The mode named `name` exactly.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_tables_are_the_enums() {
        let launch: Vec<String> = std::iter::once(DynamoBackend::No)
            .chain(DynamoBackend::MENU)
            .map(|b| b.offered_name().to_lowercase())
            .collect();
        assert_eq!(launch, DynamoBackend::LAUNCH_CHOICES);
        let modes: Vec<&str> = MixedPrecision::ALL.map(MixedPrecision::name).to_vec();
        assert_eq!(modes, MixedPrecision::CHOICES);
    }

    #[test]
    fn names_parse_back() {
        for t in DistributedType::ALL {
            assert_eq!(DistributedType::parse(t.name()), Some(t));
        }
        for b in DynamoBackend::ALL {
            assert_eq!(DynamoBackend::parse(b.name()), Some(b));
            assert_eq!(DynamoBackend::parse(&b.name().to_lowercase()), Some(b));
        }
        assert_eq!(
            DynamoBackend::parse("torhchxla_trace_once"),
            None,
            "no backend has the misspelt name"
        );
        assert_eq!(DynamoBackend::parse("INDUCTORS"), None);
        for m in MixedPrecision::ALL {
            assert_eq!(MixedPrecision::parse(m.name()), Some(m));
        }
        assert_eq!(DistributedType::parse("multi_gpu"), None, "names are exact");
    }
}
