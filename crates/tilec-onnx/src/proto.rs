//! Hand-written [`prost`] bindings for the ONNX protobuf schema.
//!
//! These mirror `onnx/onnx.proto` (and the `SequenceProto` / `MapProto` /
//! `OptionalProto` messages of `onnx/onnx-data.proto`) as shipped with
//! `onnx==1.23.2` (IR version 14, a superset of IR 11). Field numbers match the
//! official schema exactly; no build script or `protoc` is involved.
//!
//! The upstream schema is `proto2`. Prost's proto3-style encoding is used
//! here: singular scalar fields are plain values (field presence is not
//! tracked, an absent field reads as its default) and default values are not
//! written on encode. Decoding is fully wire-compatible either way. Repeated
//! numeric fields that are *not* `[packed = true]` upstream (e.g.
//! `TensorProto.dims`, `AttributeProto.ints`) are marked `packed = "false"` so
//! encoding matches what the reference protobuf implementation writes;
//! decoding accepts both forms regardless.
//!
//! Nested messages and enums live in snake_case modules named after their
//! parent message, following the `prost-build` convention (e.g.
//! [`tensor_proto::DataType`], [`type_proto::Value`]). Enum-typed fields are
//! stored as `i32`; use the generated accessors (e.g. [`AttributeProto::r#type`])
//! or `TryFrom<i32>` to get the enum.

// ---------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------

/// IR version 11 (published 2025-05-12): FLOAT4E2M1, multi-device protos.
pub const IR_VERSION_2025_05_12: i64 = 11;
/// IR version 12 (published 2025-08-26): FLOAT8E8M0.
pub const IR_VERSION_2025_08_26: i64 = 12;
/// IR version 13 (published 2025-11-06): UINT2, INT2.
pub const IR_VERSION_2025_11_06: i64 = 13;
/// The newest IR version described by this schema (`Version.IR_VERSION` in
/// onnx 1.23: FLOAT6E2M3, FLOAT6E3M2, `TypeProto.Opaque` outside ONNX-ML).
pub const IR_VERSION: i64 = 14;

/// Operator status (`onnx.OperatorStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum OperatorStatus {
    Experimental = 0,
    Stable = 1,
}

// ---------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------

/// A named attribute of a node (or a reference to a function attribute).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// Set when this attribute refers to an attribute of the enclosing function.
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
    #[prost(string, tag = "13")]
    pub doc_string: String,
    /// Discriminator telling which value field below is in use.
    #[prost(enumeration = "attribute_proto::AttributeType", tag = "20")]
    pub r#type: i32,
    #[prost(float, tag = "2")]
    pub f: f32,
    #[prost(int64, tag = "3")]
    pub i: i64,
    /// UTF-8 string (stored as bytes).
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    #[prost(message, optional, tag = "6")]
    pub g: Option<GraphProto>,
    #[prost(message, optional, tag = "22")]
    pub sparse_tensor: Option<SparseTensorProto>,
    #[prost(message, optional, tag = "14")]
    pub tp: Option<TypeProto>,
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub graphs: Vec<GraphProto>,
    #[prost(message, repeated, tag = "23")]
    pub sparse_tensors: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub type_protos: Vec<TypeProto>,
}

/// Nested types of [`AttributeProto`].
pub mod attribute_proto {
    /// `AttributeProto.AttributeType`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum AttributeType {
        Undefined = 0,
        Float = 1,
        Int = 2,
        String = 3,
        Tensor = 4,
        Graph = 5,
        SparseTensor = 11,
        TypeProto = 13,
        Floats = 6,
        Ints = 7,
        Strings = 8,
        Tensors = 9,
        Graphs = 10,
        SparseTensors = 12,
        TypeProtos = 14,
    }
}

// ---------------------------------------------------------------------------
// Values, nodes, graphs, models
// ---------------------------------------------------------------------------

/// Name and type of a graph input/output/intermediate value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
    #[prost(string, tag = "3")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "4")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// A computation node (one operator invocation).
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(string, tag = "7")]
    pub domain: String,
    #[prost(string, tag = "8")]
    pub overload: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    #[prost(string, tag = "6")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "9")]
    pub metadata_props: Vec<StringStringEntryProto>,
    #[prost(message, repeated, tag = "10")]
    pub device_configurations: Vec<NodeDeviceConfigurationProto>,
}

/// `IntIntListEntryProto` (multi-device sharding maps).
#[derive(Clone, PartialEq, prost::Message)]
pub struct IntIntListEntryProto {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, repeated, packed = "false", tag = "2")]
    pub value: Vec<i64>,
}

/// Multi-device configuration of a node.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeDeviceConfigurationProto {
    #[prost(string, tag = "1")]
    pub configuration_id: String,
    #[prost(message, repeated, tag = "2")]
    pub sharding_spec: Vec<ShardingSpecProto>,
    #[prost(int32, tag = "3")]
    pub pipeline_stage: i32,
}

/// Sharding of one tensor across devices.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ShardingSpecProto {
    #[prost(string, tag = "1")]
    pub tensor_name: String,
    #[prost(int64, repeated, packed = "false", tag = "2")]
    pub device: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub index_to_device_group_map: Vec<IntIntListEntryProto>,
    #[prost(message, repeated, tag = "4")]
    pub sharded_dim: Vec<ShardedDimProto>,
}

/// Sharding of one tensor axis.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ShardedDimProto {
    #[prost(int64, tag = "1")]
    pub axis: i64,
    #[prost(message, repeated, tag = "2")]
    pub simple_sharding: Vec<SimpleShardedDimProto>,
}

/// A contiguous piece of a sharded axis.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SimpleShardedDimProto {
    #[prost(oneof = "simple_sharded_dim_proto::Dim", tags = "1, 2")]
    pub dim: Option<simple_sharded_dim_proto::Dim>,
    #[prost(int64, tag = "3")]
    pub num_shards: i64,
}

/// Nested types of [`SimpleShardedDimProto`].
pub mod simple_sharded_dim_proto {
    /// `oneof dim`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Dim {
        #[prost(int64, tag = "1")]
        DimValue(i64),
        #[prost(string, tag = "2")]
        DimParam(String),
    }
}

/// Training information (initialization and training-step graphs).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrainingInfoProto {
    #[prost(message, optional, tag = "1")]
    pub initialization: Option<GraphProto>,
    #[prost(message, optional, tag = "2")]
    pub algorithm: Option<GraphProto>,
    #[prost(message, repeated, tag = "3")]
    pub initialization_binding: Vec<StringStringEntryProto>,
    #[prost(message, repeated, tag = "4")]
    pub update_binding: Vec<StringStringEntryProto>,
}

/// The top-level ONNX model.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "2")]
    pub producer_name: String,
    #[prost(string, tag = "3")]
    pub producer_version: String,
    #[prost(string, tag = "4")]
    pub domain: String,
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    #[prost(string, tag = "6")]
    pub doc_string: String,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
    #[prost(message, repeated, tag = "20")]
    pub training_info: Vec<TrainingInfoProto>,
    #[prost(message, repeated, tag = "25")]
    pub functions: Vec<FunctionProto>,
    #[prost(message, repeated, tag = "26")]
    pub configuration: Vec<DeviceConfigurationProto>,
}

/// A multi-device configuration (IR 11).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeviceConfigurationProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub num_devices: i32,
    #[prost(string, repeated, tag = "3")]
    pub device: Vec<String>,
}

/// A string key/value pair (metadata, external-data descriptors, bindings).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// Quantization parameters attached to a tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorAnnotation {
    #[prost(string, tag = "1")]
    pub tensor_name: String,
    #[prost(message, repeated, tag = "2")]
    pub quant_parameter_tensor_names: Vec<StringStringEntryProto>,
}

/// A graph: nodes in topological order plus inputs, outputs, initializers.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub sparse_initializer: Vec<SparseTensorProto>,
    #[prost(string, tag = "10")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "14")]
    pub quantization_annotation: Vec<TensorAnnotation>,
    #[prost(message, repeated, tag = "16")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

// ---------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------

/// A (dense) tensor value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// A [`tensor_proto::DataType`] value (an `int32` upstream, not an enum).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(message, optional, tag = "3")]
    pub segment: Option<tensor_proto::Segment>,
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(string, tag = "12")]
    pub doc_string: String,
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    /// Keys `location`, `offset`, `length`, `checksum` when
    /// `data_location == EXTERNAL`.
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    #[prost(enumeration = "tensor_proto::DataLocation", tag = "14")]
    pub data_location: i32,
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    #[prost(message, repeated, tag = "16")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// Nested types of [`TensorProto`].
pub mod tensor_proto {
    /// `TensorProto.DataType` (element types).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataType {
        Undefined = 0,
        Float = 1,
        Uint8 = 2,
        Int8 = 3,
        Uint16 = 4,
        Int16 = 5,
        Int32 = 6,
        Int64 = 7,
        String = 8,
        Bool = 9,
        Float16 = 10,
        Double = 11,
        Uint32 = 12,
        Uint64 = 13,
        Complex64 = 14,
        Complex128 = 15,
        Bfloat16 = 16,
        Float8e4m3fn = 17,
        Float8e4m3fnuz = 18,
        Float8e5m2 = 19,
        Float8e5m2fnuz = 20,
        Uint4 = 21,
        Int4 = 22,
        Float4e2m1 = 23,
        Float8e8m0 = 24,
        Uint2 = 25,
        Int2 = 26,
        Float6e2m3 = 27,
        Float6e3m2 = 28,
    }

    /// A segment of a large tensor split across several `TensorProto`s.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Segment {
        #[prost(int64, tag = "1")]
        pub begin: i64,
        #[prost(int64, tag = "2")]
        pub end: i64,
    }

    /// Where a tensor's data is stored.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataLocation {
        /// In this message (`raw_data` or a typed `*_data` field).
        Default = 0,
        /// In an external file described by `external_data`.
        External = 1,
    }
}

/// A sparse tensor in COO format.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseTensorProto {
    /// The non-default values (1-D, `[NNZ]`); its name is the tensor's name.
    #[prost(message, optional, tag = "1")]
    pub values: Option<TensorProto>,
    /// INT64 indices, `[NNZ, rank]` or linearized `[NNZ]`.
    #[prost(message, optional, tag = "2")]
    pub indices: Option<TensorProto>,
    #[prost(int64, repeated, packed = "false", tag = "3")]
    pub dims: Vec<i64>,
}

/// A (possibly symbolic) tensor shape.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<tensor_shape_proto::Dimension>,
}

/// Nested types of [`TensorShapeProto`].
pub mod tensor_shape_proto {
    /// One dimension: a constant, a symbolic name, or unknown (`value == None`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        #[prost(oneof = "dimension::Value", tags = "1, 2")]
        pub value: Option<dimension::Value>,
        #[prost(string, tag = "3")]
        pub denotation: String,
    }

    /// Nested types of [`Dimension`].
    pub mod dimension {
        /// `oneof value`.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            #[prost(int64, tag = "1")]
            DimValue(i64),
            #[prost(string, tag = "2")]
            DimParam(String),
        }
    }
}

// ---------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------

/// The type of a value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    #[prost(oneof = "type_proto::Value", tags = "1, 4, 5, 9, 8, 7")]
    pub value: Option<type_proto::Value>,
    #[prost(string, tag = "6")]
    pub denotation: String,
}

/// Nested types of [`TypeProto`].
pub mod type_proto {
    use super::TensorShapeProto;
    use super::TypeProto;

    /// A dense tensor type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Tensor {
        /// A [`super::tensor_proto::DataType`] value.
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    /// A homogeneous sequence type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sequence {
        #[prost(message, optional, boxed, tag = "1")]
        pub elem_type: Option<Box<TypeProto>>,
    }

    /// A map type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Map {
        /// An integral or string [`super::tensor_proto::DataType`] value.
        #[prost(int32, tag = "1")]
        pub key_type: i32,
        #[prost(message, optional, boxed, tag = "2")]
        pub value_type: Option<Box<TypeProto>>,
    }

    /// An optional type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Optional {
        #[prost(message, optional, boxed, tag = "1")]
        pub elem_type: Option<Box<TypeProto>>,
    }

    /// A sparse tensor type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SparseTensor {
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    /// An opaque type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Opaque {
        #[prost(string, tag = "1")]
        pub domain: String,
        #[prost(string, tag = "2")]
        pub name: String,
    }

    /// `oneof value`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(message, tag = "1")]
        TensorType(Tensor),
        #[prost(message, tag = "4")]
        SequenceType(Sequence),
        #[prost(message, tag = "5")]
        MapType(Map),
        #[prost(message, tag = "9")]
        OptionalType(Optional),
        #[prost(message, tag = "8")]
        SparseTensorType(SparseTensor),
        #[prost(message, tag = "7")]
        OpaqueType(Opaque),
    }
}

/// An operator set import: `(domain, version)`; the empty domain is `ai.onnx`.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// A model-local function.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FunctionProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "4")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    pub output: Vec<String>,
    /// Names of attributes without default values.
    #[prost(string, repeated, tag = "6")]
    pub attribute: Vec<String>,
    /// Attributes with default values.
    #[prost(message, repeated, tag = "11")]
    pub attribute_proto: Vec<AttributeProto>,
    #[prost(message, repeated, tag = "7")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "8")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "9")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "10")]
    pub domain: String,
    #[prost(string, tag = "13")]
    pub overload: String,
    #[prost(message, repeated, tag = "12")]
    pub value_info: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

// ---------------------------------------------------------------------------
// onnx-data.proto: non-tensor values (test data for sequence/map/optional)
// ---------------------------------------------------------------------------

/// A sequence value (`onnx-data.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SequenceProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// A [`sequence_proto::DataType`] value telling which `*_values` is used.
    #[prost(int32, tag = "2")]
    pub elem_type: i32,
    #[prost(message, repeated, tag = "3")]
    pub tensor_values: Vec<TensorProto>,
    #[prost(message, repeated, tag = "4")]
    pub sparse_tensor_values: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "5")]
    pub sequence_values: Vec<SequenceProto>,
    #[prost(message, repeated, tag = "6")]
    pub map_values: Vec<MapProto>,
    #[prost(message, repeated, tag = "7")]
    pub optional_values: Vec<OptionalProto>,
}

/// Nested types of [`SequenceProto`].
pub mod sequence_proto {
    /// `SequenceProto.DataType`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataType {
        Undefined = 0,
        Tensor = 1,
        SparseTensor = 2,
        Sequence = 3,
        Map = 4,
        Optional = 5,
    }
}

/// A map value (`onnx-data.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MapProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// A [`tensor_proto::DataType`] value (integral or STRING).
    #[prost(int32, tag = "2")]
    pub key_type: i32,
    #[prost(int64, repeated, packed = "false", tag = "3")]
    pub keys: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "4")]
    pub string_keys: Vec<Vec<u8>>,
    #[prost(message, optional, tag = "5")]
    pub values: Option<SequenceProto>,
}

/// An optional value (`onnx-data.proto`); no `*_value` set means "none".
#[derive(Clone, PartialEq, prost::Message)]
pub struct OptionalProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// An [`optional_proto::DataType`] value telling which `*_value` is used.
    #[prost(int32, tag = "2")]
    pub elem_type: i32,
    #[prost(message, optional, tag = "3")]
    pub tensor_value: Option<TensorProto>,
    #[prost(message, optional, tag = "4")]
    pub sparse_tensor_value: Option<SparseTensorProto>,
    #[prost(message, optional, tag = "5")]
    pub sequence_value: Option<SequenceProto>,
    #[prost(message, optional, tag = "6")]
    pub map_value: Option<MapProto>,
    #[prost(message, optional, boxed, tag = "7")]
    pub optional_value: Option<Box<OptionalProto>>,
}

/// Nested types of [`OptionalProto`].
pub mod optional_proto {
    /// `OptionalProto.DataType`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataType {
        Undefined = 0,
        Tensor = 1,
        SparseTensor = 2,
        Sequence = 3,
        Map = 4,
        Optional = 5,
    }
}
