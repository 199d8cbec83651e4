//! bf16 matmuls on tensor cores through `VK_KHR_shader_bfloat16`.
//!
//! WGSL has no bf16 type, so the shared tensor-core kernel holds bf16 tiles as `f16` in a
//! source marked [`tessera_wgsl::F16_IS_BF16`]. naga writes and validates that module as usual;
//! [`f16_as_bf16`] then re-encodes its 16-bit float type as bfloat16 and checks that every
//! instruction touching it is one `SPV_KHR_bfloat16` allows on bfloat16 (conversions, memory,
//! composites, cooperative-matrix products): none of the kernel's arithmetic is done in the
//! 16-bit type, so the re-encoded module computes the bf16 product. Anything else is refused
//! with the instruction named, never compiled. ash 0.38 predates the extension, so its names,
//! feature structure and component type are declared here from the Vulkan registry.

use std::collections::HashSet;
use std::ffi::{c_void, CStr};

use ash::vk;
use rspirv::binary::Assemble;
use rspirv::dr::{self, Instruction, Operand};
use rspirv::spirv::{Capability, FPEncoding, Op};

/// The device extension.
pub(crate) const SHADER_BFLOAT16: &CStr = c"VK_KHR_shader_bfloat16";

/// `VK_COMPONENT_TYPE_BFLOAT16_KHR`: bf16 elements of a cooperative matrix.
pub(crate) const BFLOAT16: vk::ComponentTypeKHR = vk::ComponentTypeKHR::from_raw(1000141000);

/// `VkPhysicalDeviceShaderBfloat16FeaturesKHR`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bfloat16Features {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    pub(crate) shader_bfloat16_type: vk::Bool32,
    pub(crate) shader_bfloat16_dot_product: vk::Bool32,
    pub(crate) shader_bfloat16_cooperative_matrix: vk::Bool32,
}

impl Default for Bfloat16Features {
    fn default() -> Bfloat16Features {
        Bfloat16Features {
            s_type: vk::StructureType::from_raw(1000141000),
            p_next: std::ptr::null_mut(),
            shader_bfloat16_type: vk::FALSE,
            shader_bfloat16_dot_product: vk::FALSE,
            shader_bfloat16_cooperative_matrix: vk::FALSE,
        }
    }
}

impl Bfloat16Features {
    /// What the `coop` kernel on bf16 needs enabled.
    pub(crate) fn for_tensor_cores() -> Bfloat16Features {
        Bfloat16Features {
            shader_bfloat16_type: vk::TRUE,
            shader_bfloat16_cooperative_matrix: vk::TRUE,
            ..Bfloat16Features::default()
        }
    }
}

// SAFETY: the structure is laid out as the registry declares it, with its structure type and
// chain pointer first, and the Vulkan specification allows it in both chains.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Bfloat16Features {}
// SAFETY: as above.
unsafe impl vk::ExtendsDeviceCreateInfo for Bfloat16Features {}

/// `words` (a module naga wrote from a source marked `F16_IS_BF16`) with its 16-bit float type
/// encoded as bfloat16, or what stops it: no 16-bit float type, or an instruction
/// `SPV_KHR_bfloat16` does not allow on one.
pub(crate) fn f16_as_bf16(words: &[u32]) -> Result<Vec<u32>, String> {
    let mut module =
        dr::load_words(words).map_err(|e| format!("reading naga's SPIR-V back: {e}"))?;
    // Ids whose type is or holds the 16-bit float: types, constants and global variables in
    // declaration order (a declaration refers only to earlier ones).
    let mut bf16 = HashSet::new();
    let mut matrices = false;
    for inst in &mut module.types_global_values {
        let half =
            inst.class.opcode == Op::TypeFloat && inst.operands == [Operand::LiteralBit32(16)];
        if half {
            inst.operands
                .push(Operand::FPEncoding(FPEncoding::BFloat16KHR));
        }
        if half || mentions(inst, &bf16) {
            matrices |= inst.class.opcode == Op::TypeCooperativeMatrixKHR;
            bf16.extend(inst.result_id);
        }
    }
    if bf16.is_empty() {
        return Err("a kernel marked as bf16 declares no 16-bit float type".into());
    }
    let code = || {
        module.functions.iter().flat_map(|f| {
            f.def
                .iter()
                .chain(&f.parameters)
                .chain(f.blocks.iter().flat_map(|b| &b.instructions))
        })
    };
    let values: Vec<u32> = code()
        .filter(|i| i.result_type.is_some_and(|t| bf16.contains(&t)))
        .filter_map(|i| i.result_id)
        .collect();
    bf16.extend(values);
    if let Some(inst) = code().find(|i| !allowed(i.class.opcode) && mentions(i, &bf16)) {
        return Err(format!(
            "Op{} on bf16 values, which SPV_KHR_bfloat16 does not allow",
            inst.class.opname
        ));
    }
    module
        .capabilities
        .retain(|c| c.operands != [Operand::Capability(Capability::Float16)]);
    let mut capabilities = vec![Capability::BFloat16TypeKHR];
    if matrices {
        capabilities.push(Capability::BFloat16CooperativeMatrixKHR);
    }
    for capability in capabilities {
        let operand = vec![Operand::Capability(capability)];
        module
            .capabilities
            .push(Instruction::new(Op::Capability, None, None, operand));
    }
    let extension = vec![Operand::LiteralString("SPV_KHR_bfloat16".into())];
    module
        .extensions
        .push(Instruction::new(Op::Extension, None, None, extension));
    Ok(module.assemble())
}

/// Whether `inst` has a result type in `ids` or an id operand in `ids`.
fn mentions(inst: &Instruction, ids: &HashSet<u32>) -> bool {
    inst.result_type.is_some_and(|t| ids.contains(&t))
        || inst
            .operands
            .iter()
            .any(|o| matches!(o, Operand::IdRef(id) if ids.contains(id)))
}

/// Whether `SPV_KHR_bfloat16` allows bfloat16 values in instructions `op`: its validation
/// rules list constant creation, memory, function, conversion and composite instructions,
/// `OpDot`, the cooperative-matrix product and length, `OpSelect`, `OpPhi`, `OpReturnValue`
/// and the lifetime markers (cooperative-matrix loads and stores are memory instructions).
fn allowed(op: Op) -> bool {
    matches!(
        op,
        Op::Variable
            | Op::Load
            | Op::Store
            | Op::CopyMemory
            | Op::CopyMemorySized
            | Op::AccessChain
            | Op::InBoundsAccessChain
            | Op::PtrAccessChain
            | Op::InBoundsPtrAccessChain
            | Op::CooperativeMatrixLoadKHR
            | Op::CooperativeMatrixStoreKHR
            | Op::Function
            | Op::FunctionParameter
            | Op::FunctionCall
            | Op::FConvert
            | Op::ConvertFToU
            | Op::ConvertFToS
            | Op::ConvertSToF
            | Op::ConvertUToF
            | Op::Bitcast
            | Op::VectorExtractDynamic
            | Op::VectorInsertDynamic
            | Op::VectorShuffle
            | Op::CompositeConstruct
            | Op::CompositeExtract
            | Op::CompositeInsert
            | Op::CopyObject
            | Op::CopyLogical
            | Op::Dot
            | Op::CooperativeMatrixMulAddKHR
            | Op::CooperativeMatrixLengthKHR
            | Op::Select
            | Op::Phi
            | Op::ReturnValue
            | Op::LifetimeStart
            | Op::LifetimeStop
    )
}

#[cfg(test)]
mod tests {
    use naga::back::spv::ZeroInitializeWorkgroupMemoryMode;
    use naga::proc::BoundsCheckPolicy;

    use super::*;
    use crate::pipelines::to_spirv;

    /// A kernel shaped as the tensor-core matmul: f32 values converted into 16-bit tiles in
    /// workgroup memory, multiplied on cooperative matrices into f32, with `extra` code after.
    fn kernel(extra: &str) -> String {
        format!(
            "enable f16;\nenable wgpu_cooperative_matrix;\n\
             @group(1) @binding(1) var<storage, read_write> b1: array<f32>;\n\
             var<workgroup> tile: array<f16, 256>;\n\
             var<workgroup> sums: array<f32, 256>;\n\
             @compute @workgroup_size(32)\n\
             fn main(@builtin(local_invocation_index) lid: u32) {{\n\
             for (var e = lid; e < 256u; e += 32u) {{ tile[e] = f16(b1[e]); }}\n\
             workgroupBarrier();\n\
             let a = coopLoadT<coop_mat16x16<f16, A>>(&tile[0], 16u);\n\
             let b = coopLoadT<coop_mat16x16<f16, B>>(&tile[0], 16u);\n\
             let c = coopMultiplyAdd(a, b, coop_mat16x16<f32, C>());\n\
             coopStoreT(c, &sums[0], 16u);\n\
             workgroupBarrier();\n\
             for (var e = lid; e < 256u; e += 32u) {{ b1[e] = sums[e]; }}\n\
             {extra}}}\n"
        )
    }

    fn spirv(src: &str) -> Vec<u32> {
        let zero = ZeroInitializeWorkgroupMemoryMode::Native;
        to_spirv("test", src, 1, zero, BoundsCheckPolicy::Restrict)
            .expect("naga compiles the kernel")
            .0
    }

    #[test]
    fn the_16_bit_float_type_becomes_bfloat16() {
        let words = f16_as_bf16(&spirv(&kernel(""))).expect("the kernel re-encodes");
        let module = dr::load_words(&words).expect("valid SPIR-V words");
        let floats: Vec<_> = module
            .types_global_values
            .iter()
            .filter(|i| i.class.opcode == Op::TypeFloat)
            .map(|i| i.operands.clone())
            .collect();
        assert!(floats.contains(&vec![
            Operand::LiteralBit32(16),
            Operand::FPEncoding(FPEncoding::BFloat16KHR)
        ]));
        assert!(!floats.contains(&vec![Operand::LiteralBit32(16)]));
        let capabilities: Vec<_> = module
            .capabilities
            .iter()
            .map(|i| i.operands[0].clone())
            .collect();
        assert!(capabilities.contains(&Operand::Capability(Capability::BFloat16TypeKHR)));
        assert!(capabilities.contains(&Operand::Capability(
            Capability::BFloat16CooperativeMatrixKHR
        )));
        assert!(!capabilities.contains(&Operand::Capability(Capability::Float16)));
        assert!(module
            .extensions
            .iter()
            .any(|i| i.operands == [Operand::LiteralString("SPV_KHR_bfloat16".into())]));
    }

    #[test]
    fn arithmetic_on_the_16_bit_type_is_refused() {
        let words = spirv(&kernel("tile[lid] = tile[lid] * f16(2.0);\n"));
        let err = f16_as_bf16(&words).expect_err("bf16 arithmetic is refused");
        assert!(err.contains("OpFMul"), "{err}");
    }

    #[test]
    fn a_kernel_without_16_bit_floats_is_refused() {
        let src = "@group(1) @binding(1) var<storage, read_write> b1: array<f32>;\n\
                   @compute @workgroup_size(32)\n\
                   fn main(@builtin(local_invocation_index) lid: u32) { b1[lid] = 1.0; }\n";
        assert!(f16_as_bf16(&spirv(src)).is_err());
    }
}
