//! Elementwise kernels.

use super::util::{broadcast, broadcast_index_map};
use tilec_ir::op::{BinaryOp, QuantOp, UnaryOp};
use tilec_ir::{DType, Tensor};

pub fn unary(op: &UnaryOp, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let x = args[0];
    let f: fn(f64) -> f64 = match op {
        UnaryOp::Relu => |v| if v > 0.0 { v } else { 0.0 },
        UnaryOp::Neg => |v| -v,
        UnaryOp::Exp => f64::exp,
        _ => return Err(format!("unary {op:?} not implemented")),
    };
    let v: Vec<f64> = x.to_f64_vec().into_iter().map(f).collect();
    Ok(vec![Tensor::from_f64s(x.dtype(), x.shape().to_vec(), &v).map_err(|e| e.to_string())?])
}

pub fn binary(op: &BinaryOp, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let (a, b) = (args[0], args[1]);
    let shape = broadcast(a.shape(), b.shape())?;
    let ma = broadcast_index_map(a.shape(), &shape);
    let mb = broadcast_index_map(b.shape(), &shape);
    let (va, vb) = (a.to_f64_vec(), b.to_f64_vec());
    let f: fn(f64, f64) -> f64 = match op {
        BinaryOp::Add => |x, y| x + y,
        BinaryOp::Sub => |x, y| x - y,
        BinaryOp::Mul => |x, y| x * y,
        BinaryOp::Div => |x, y| x / y,
        _ => return Err(format!("binary {op:?} not implemented")),
    };
    let v: Vec<f64> = ma.iter().zip(&mb).map(|(&i, &j)| f(va[i], vb[j])).collect();
    Ok(vec![Tensor::from_f64s(a.dtype(), shape, &v).map_err(|e| e.to_string())?])
}

pub fn where_(_args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    Err("where not implemented".into())
}

pub fn cast(to: DType, _saturate: bool, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    Ok(vec![args[0].cast(to)])
}

pub fn quant(op: &QuantOp, _args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    Err(format!("{op:?} not implemented"))
}
