//! Element types and devices, and their DLPack encodings.

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};

use crate::error::{Error, Result};

/// The element types ndx stores. Discriminants are the C ABI values (`NDX_DTYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DType {
    /// One byte per element, 0 or 1.
    Bool = 1,
    /// Signed 8-bit integer.
    I8 = 2,
    /// Signed 16-bit integer.
    I16 = 3,
    /// Signed 32-bit integer.
    I32 = 4,
    /// Signed 64-bit integer.
    I64 = 5,
    /// Unsigned 8-bit integer.
    U8 = 6,
    /// Unsigned 16-bit integer.
    U16 = 7,
    /// Unsigned 32-bit integer.
    U32 = 8,
    /// Unsigned 64-bit integer.
    U64 = 9,
    /// IEEE half precision.
    F16 = 10,
    /// bfloat16.
    BF16 = 11,
    /// IEEE single precision.
    F32 = 12,
    /// IEEE double precision.
    F64 = 13,
}

impl DType {
    /// Every dtype, in ABI order.
    pub const ALL: [DType; 13] = [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// The dtype with ABI value `raw`.
    pub fn from_raw(raw: i32) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| *d as i32 == raw)
    }

    /// The dtype named `name` (as [`DType::name`] spells it).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.name() == name)
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// The NumPy-style name: `"float32"`, `"bfloat16"`, ...
    pub fn name(self) -> &'static str {
        self.c_name().to_str().unwrap_or("?")
    }

    /// [`DType::name`] as a static C string.
    pub fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            DType::Bool => c"bool",
            DType::I8 => c"int8",
            DType::I16 => c"int16",
            DType::I32 => c"int32",
            DType::I64 => c"int64",
            DType::U8 => c"uint8",
            DType::U16 => c"uint16",
            DType::U32 => c"uint32",
            DType::U64 => c"uint64",
            DType::F16 => c"float16",
            DType::BF16 => c"bfloat16",
            DType::F32 => c"float32",
            DType::F64 => c"float64",
        }
    }

    /// The DLPack encoding (one lane).
    pub fn to_dl(self) -> DLDataType {
        let (code, bits) = match self {
            DType::Bool => (DLDataTypeCode::BOOL, 8),
            DType::I8 => (DLDataTypeCode::INT, 8),
            DType::I16 => (DLDataTypeCode::INT, 16),
            DType::I32 => (DLDataTypeCode::INT, 32),
            DType::I64 => (DLDataTypeCode::INT, 64),
            DType::U8 => (DLDataTypeCode::UINT, 8),
            DType::U16 => (DLDataTypeCode::UINT, 16),
            DType::U32 => (DLDataTypeCode::UINT, 32),
            DType::U64 => (DLDataTypeCode::UINT, 64),
            DType::F16 => (DLDataTypeCode::FLOAT, 16),
            DType::BF16 => (DLDataTypeCode::BFLOAT, 16),
            DType::F32 => (DLDataTypeCode::FLOAT, 32),
            DType::F64 => (DLDataTypeCode::FLOAT, 64),
        };
        DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }

    /// The dtype a DLPack encoding stands for, or `None` when ndx does not support it.
    pub fn from_dl(dl: DLDataType) -> Option<DType> {
        if dl.lanes != 1 {
            return None;
        }
        DType::ALL.iter().copied().find(|d| d.to_dl() == dl)
    }
}

/// The name of a DLPack type code, for messages.
pub fn dl_code_name(code: u8) -> &'static str {
    match code {
        0 => "int",
        1 => "uint",
        2 => "float",
        3 => "opaque handle",
        4 => "bfloat",
        5 => "complex",
        6 => "bool",
        7..=14 => "float8",
        15 | 16 => "float6",
        17 => "float4",
        _ => "unknown",
    }
}

/// Describes a DLPack dtype for an error message.
pub fn describe_dl_dtype(dl: DLDataType) -> String {
    match DType::from_dl(dl) {
        Some(d) => d.name().to_string(),
        None => format!(
            "code {} ({}), bits {}, lanes {}",
            dl.code.0,
            dl_code_name(dl.code.0),
            dl.bits,
            dl.lanes
        ),
    }
}

/// The kinds of memory ndx accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Host memory.
    Cpu,
    /// CUDA device memory.
    Cuda,
    /// Pinned host memory (cudaMallocHost).
    CudaHost,
    /// CUDA managed memory (cudaMallocManaged).
    CudaManaged,
}

/// A device: a kind of memory and an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// The kind of memory.
    pub kind: DeviceKind,
    /// The device index (0 for host memory).
    pub id: i32,
}

impl Device {
    /// Host memory.
    pub const CPU: Device = Device {
        kind: DeviceKind::Cpu,
        id: 0,
    };

    /// Whether the host may read and write this memory directly.
    pub fn host_accessible(self) -> bool {
        !matches!(self.kind, DeviceKind::Cuda)
    }

    /// The DLPack encoding.
    pub fn to_dl(self) -> DLDevice {
        let device_type = match self.kind {
            DeviceKind::Cpu => DLDeviceType::CPU,
            DeviceKind::Cuda => DLDeviceType::CUDA,
            DeviceKind::CudaHost => DLDeviceType::CUDAHOST,
            DeviceKind::CudaManaged => DLDeviceType::CUDAMANAGED,
        };
        DLDevice {
            device_type,
            device_id: self.id,
        }
    }

    /// The device a DLPack encoding stands for; `what` names the tensor in errors.
    pub fn from_dl(dl: DLDevice, what: &str) -> Result<Device> {
        let kind = match dl.device_type {
            DLDeviceType::CPU => DeviceKind::Cpu,
            DLDeviceType::CUDA => DeviceKind::Cuda,
            DLDeviceType::CUDAHOST => DeviceKind::CudaHost,
            DLDeviceType::CUDAMANAGED => DeviceKind::CudaManaged,
            other => {
                return Err(Error::value(format!(
                    "{what}: device type {} ({}) is not supported; expected kDLCPU (1), kDLCUDA (2), kDLCUDAHost (3) or kDLCUDAManaged (13)",
                    other.0,
                    dl_device_name(other.0)
                )));
            }
        };
        if dl.device_id < 0 {
            return Err(Error::value(format!(
                "{what}: device id is {}, expected a non-negative index",
                dl.device_id
            )));
        }
        Ok(Device {
            kind,
            id: dl.device_id,
        })
    }
}

/// The `kDL*` name of a DLPack device type, for messages.
pub fn dl_device_name(device_type: u32) -> &'static str {
    match device_type {
        1 => "kDLCPU",
        2 => "kDLCUDA",
        3 => "kDLCUDAHost",
        4 => "kDLOpenCL",
        7 => "kDLVulkan",
        8 => "kDLMetal",
        9 => "kDLVPI",
        10 => "kDLROCM",
        11 => "kDLROCMHost",
        12 => "kDLExtDev",
        13 => "kDLCUDAManaged",
        14 => "kDLOneAPI",
        15 => "kDLWebGPU",
        16 => "kDLHexagon",
        17 => "kDLMAIA",
        18 => "kDLTrn",
        _ => "unknown",
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dl = self.to_dl();
        write!(f, "{}:{}", dl_device_name(dl.device_type.0), self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_dlpack() {
        for d in DType::ALL {
            assert_eq!(DType::from_dl(d.to_dl()), Some(d));
            assert_eq!(DType::from_raw(d as i32), Some(d));
            assert_eq!(d.to_dl().bits as usize, d.itemsize() * 8);
        }
    }

    #[test]
    fn vector_and_complex_types_are_rejected_with_a_description() {
        let mut dl = DType::F32.to_dl();
        dl.lanes = 4;
        assert_eq!(DType::from_dl(dl), None);
        assert_eq!(describe_dl_dtype(dl), "code 2 (float), bits 32, lanes 4");
        let complex = DLDataType {
            code: DLDataTypeCode::COMPLEX,
            bits: 64,
            lanes: 1,
        };
        assert_eq!(DType::from_dl(complex), None);
    }
}
