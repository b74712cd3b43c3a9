//! Sessions (`tilec::session`): one import, one build per binding of the symbolic dimensions,
//! runs on host tensors and on caller buffers (`run_raw`), and input errors that say what was
//! expected.

use std::path::PathBuf;

use tilec::exec::{Memory, RawTensor};
use tilec::session::{Extent, Session, SessionOptions};
use tilec::{DType, Tensor};

fn gpt2() -> (Session, PathBuf) {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/gpt2"));
    let s = Session::from_path(&dir.join("model.onnx"), SessionOptions::default()).expect("import gpt2");
    (s, dir.join("test_data_set_0"))
}

#[test]
fn runs_recorded_inputs_and_compiles_once_per_binding() {
    let (mut s, data) = gpt2();
    assert_eq!(s.inputs()[0].shape, vec![Extent::Sym("batch".into()), Extent::Sym("seq".into())]);
    let x = tilec::tensor_io::read_tensor(&data.join("input_0.pb")).unwrap();
    let want = tilec::tensor_io::read_tensor(&data.join("output_0.pb")).unwrap();
    let got = s.run(std::slice::from_ref(&x)).unwrap();
    let c = tilec::compare::compare(&want, &got[0], 1e-3, 1e-4).unwrap();
    assert!(c.ok(), "{} of {} elements differ", c.mismatches, c.count);
    s.run(std::slice::from_ref(&x)).unwrap();
    assert_eq!(s.builds(), 1);
    s.run(&[Tensor::from_vec(vec![1, 3], vec![1i64, 2, 3]).unwrap()]).unwrap();
    assert_eq!(s.builds(), 2);
}

#[test]
fn run_raw_reads_and_writes_caller_buffers() {
    let (mut s, _) = gpt2();
    let ids: Vec<i64> = (0..8).collect();
    let x = Tensor::from_vec(vec![1, 8], ids.clone()).unwrap();
    let want = s.run(std::slice::from_ref(&x)).unwrap().remove(0);
    let b = s.bind(&[(DType::I64, &[1, 8])]).unwrap();
    let types = s.output_types(&b).unwrap();
    assert_eq!(types, vec![(DType::F32, vec![1, 8, 1024])]);
    let mut out = vec![f32::NAN; 8 * 1024];
    let raw_in = RawTensor { dtype: DType::I64, shape: vec![1, 8], addr: ids.as_ptr() as u64, memory: Memory::Host };
    let raw_out = RawTensor { dtype: DType::F32, shape: vec![1, 8, 1024], addr: out.as_mut_ptr() as u64, memory: Memory::Host };
    // SAFETY: both buffers are live, dense and of the declared sizes.
    unsafe { s.run_raw(&b, &[raw_in.clone()], &[raw_out.clone()]) }.unwrap();
    assert_eq!(want.as_slice::<f32>().unwrap(), out.as_slice());
    // A device buffer on a CPU build, and a wrong shape, are errors.
    let dev = RawTensor { memory: Memory::Device(0), ..raw_in.clone() };
    let e = unsafe { s.run_raw(&b, &[dev], &[raw_out.clone()]) }.unwrap_err().to_string();
    assert!(e.contains("GPU 0") && e.contains("compiled for the CPU"), "{e}");
    let short = RawTensor { shape: vec![1, 8, 1000], ..raw_out };
    let e = unsafe { s.run_raw(&b, &[raw_in], &[short]) }.unwrap_err().to_string();
    assert!(e.contains("output 'logits': expected f32[1, 8, 1024]"), "{e}");
}

#[test]
fn bind_says_what_was_expected() {
    let (s, _) = gpt2();
    let e = s.bind(&[(DType::F32, &[1, 8])]).unwrap_err();
    assert!(e.contains("input 'input_ids': expected i64[batch, seq]") && e.contains("wrong dtype"), "{e}");
    let e = s.bind(&[(DType::I64, &[8])]).unwrap_err();
    assert!(e.contains("wrong rank (expected 2, got 1)"), "{e}");
    let e = s.bind(&[]).unwrap_err();
    assert!(e.contains("the model has 1 inputs (input_ids), 0 were given"), "{e}");
}

#[test]
fn options_are_checked() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/gpt2/model.onnx"));
    let opts = SessionOptions { dtype: Some(DType::I8), ..Default::default() };
    let e = Session::from_path(&dir, opts).err().expect("i8 is not a precision").to_string();
    assert!(e.contains("expected f16 or bf16"), "{e}");
    let e = Session::from_bytes(b"garbage", SessionOptions::default()).err().unwrap().to_string();
    assert!(e.contains("not an ONNX model"), "{e}");
}
