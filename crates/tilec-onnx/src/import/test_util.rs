//! Helpers shared by the importer's unit tests.

use crate::proto::tensor_proto::DataType;
use crate::proto::tensor_shape_proto::{dimension, Dimension};
use crate::proto::{type_proto, TensorShapeProto, TypeProto, ValueInfoProto};

/// A float tensor input; `None` dims are the symbolic `N`.
pub(crate) fn vi(name: &str, dims: &[Option<i64>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Some(v) => dimension::Value::DimValue(*v),
                None => dimension::Value::DimParam("N".into()),
            }),
            denotation: String::new(),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: DataType::Float as i32,
                shape: Some(TensorShapeProto { dim }),
            })),
            denotation: String::new(),
        }),
        ..Default::default()
    }
}
