//! The driver runtime. Without a CUDA driver (this crate's CI machines) it checks clean
//! failures; with one (a GPU machine) it runs the scheduled kernels against the interpreter.

mod common;

use common::*;
use tilec_cuda::*;
use tilec_ir::{DType, Tensor};
use tilec_tile::*;

#[test]
fn without_a_driver_everything_fails_cleanly() {
    if is_available() {
        eprintln!("note: a CUDA device is present; the no-driver checks do not apply");
        return;
    }
    let e = Device::open(0).unwrap_err();
    assert!(
        matches!(e, CudaError::Unavailable(_) | CudaError::Driver { .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("CUDA is not available") || msg.contains("cuInit") || msg.contains("device 0"),
        "{msg}"
    );
    assert!(device_count().is_err() || device_count().unwrap() == 0);
    assert!(driver_version().is_err() || device_count().unwrap_or(0) == 0);
    // Asking again gives the same answer (no panic on a second lookup).
    assert!(!is_available());
}

fn gpu() -> Option<(Device, Compiler)> {
    if !is_available() {
        eprintln!("note: no CUDA device; GPU execution tests skipped");
        return None;
    }
    let dev = Device::open(0).unwrap();
    let nv = Nvrtc::load()
        .expect("a CUDA device is present but NVRTC was not found (set TILEC_NVRTC_LIB)");
    let c = Compiler::new(nv, &dev.props().arch());
    Some((dev, c))
}

fn poison(d: DType) -> u32 {
    match d {
        DType::F32 => 0x7fc0_0000,
        _ => 0x7fc0_7fc0,
    }
}

fn run_on_gpu(dev: &Device, gk: &GpuKernel, args: &[Tensor]) -> Tensor {
    let stream = dev.stream().unwrap();
    let bufs: Vec<DeviceBuffer> = args.iter().map(|t| dev.upload(t).unwrap()).collect();
    let out = bufs.last().unwrap();
    // All-ones bytes are a NaN in every float format, whatever the buffer's length (a bf16
    // output of 5 x 37 elements is not a whole number of 32-bit words).
    out.fill(&stream, 0, out.len(), 0xFF).unwrap();
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
    gk.launch(&stream, &ptrs).unwrap();
    stream.synchronize().unwrap();
    let last = args.last().unwrap();
    out.download(0, last.dtype(), last.shape()).unwrap()
}

#[test]
fn device_properties_are_read() {
    let Some((dev, _)) = gpu() else { return };
    let p = dev.props();
    eprintln!("{p:?}");
    assert!(
        p.sm_count > 0
            && p.l2_bytes > 0
            && p.total_mem_bytes > 0
            && p.shared_mem_per_block >= 48 * 1024
    );
    assert!(p.compute_capability.0 >= 7);
}

#[test]
fn scheduled_kernels_match_the_interpreter_on_the_gpu() {
    let Some((dev, c)) = gpu() else { return };
    for d in [DType::F32, DType::BF16] {
        for (rows, cols) in [(64, 8192), (7, 200), (5, 37)] {
            let ks = kernels(rows, cols, d);
            let scheduled: Vec<Kernel> = ks.iter().map(|(_, k, row)| schedule(k, *row)).collect();
            let loaded = load_kernels(&dev, &c, &scheduled).unwrap();
            for ((op, k, _), gk) in ks.iter().zip(&loaded) {
                let args = random_args(k, 11);
                let got = run_on_gpu(&dev, gk, &args);
                let want = reference(op, &args, rows as usize, cols as usize);
                assert_close(
                    &format!("{op} {d} {rows}x{cols} on the GPU"),
                    &got.to_f64_vec(),
                    &want,
                    tol(d),
                );
            }
        }
    }
}

#[test]
fn graphs_capture_and_replay_launches() {
    let Some((dev, c)) = gpu() else { return };
    let (rows, cols) = (32, 1024);
    let g = tilec_cuda::handbuilt::gelu_bias(rows, cols, DType::F32);
    let s = tilec_cuda::handbuilt::softmax(rows, cols, DType::F32);
    let loaded = load_kernels(&dev, &c, &[schedule(&g, false), schedule(&s, true)]).unwrap();
    let args = random_args(&g, 5);
    let bufs: Vec<DeviceBuffer> = args.iter().map(|t| dev.upload(t).unwrap()).collect();
    let out = dev.alloc(rows as usize * cols as usize * 4).unwrap();
    let stream = dev.stream().unwrap();
    out.fill_u32(&stream, poison(DType::F32)).unwrap();
    stream.synchronize().unwrap();
    let p: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
    let graph = stream
        .capture(|st| {
            loaded[0].launch(st, &p)?;
            loaded[1].launch(st, &[p[3], out.ptr()])
        })
        .unwrap();
    // Nothing ran during capture.
    let before = out
        .download(0, DType::F32, &[rows as usize, cols as usize])
        .unwrap();
    assert!(before.to_f64_vec().iter().all(|v| v.is_nan()));
    for _ in 0..3 {
        graph.launch(&stream).unwrap();
    }
    stream.synchronize().unwrap();
    let got = out
        .download(0, DType::F32, &[rows as usize, cols as usize])
        .unwrap();
    let mut a = args.clone();
    interp::run(&g, &mut a).unwrap();
    let mut b = vec![
        a[3].clone(),
        Tensor::from_f64s(
            DType::F32,
            vec![rows as usize, cols as usize],
            &vec![f64::NAN; (rows * cols) as usize],
        )
        .unwrap(),
    ];
    interp::run(&s, &mut b).unwrap();
    assert_close(
        "gelu -> softmax graph",
        &got.to_f64_vec(),
        &b[1].to_f64_vec(),
        1e-4,
    );
}

#[test]
fn arena_buffers_live_at_planned_offsets() {
    let Some((dev, _)) = gpu() else { return };
    let reqs = vec![
        tilec_runtime::BufferReq::new(1000, 256, 0, 1),
        tilec_runtime::BufferReq::new(4000, 256, 1, 2),
        tilec_runtime::BufferReq::new(1000, 256, 2, 3),
    ];
    let plan = tilec_runtime::plan(&reqs);
    let arena = dev.arena(&plan).unwrap();
    let t = Tensor::from_f64s(
        DType::F32,
        vec![250],
        &(0..250).map(|i| i as f64).collect::<Vec<_>>(),
    )
    .unwrap();
    arena
        .upload(
            1,
            &Tensor::from_f64s(DType::F32, vec![1000], &vec![7.0; 1000]).unwrap(),
        )
        .unwrap();
    arena.upload(0, &t).unwrap();
    assert_eq!(arena.download(0, DType::F32, &[250]).unwrap(), t);
    assert!(arena.ptr(3).is_err());
    let e = arena
        .buffer()
        .read(plan.arena_bytes, &mut [0u8; 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside"), "{e}");
}

#[test]
fn launch_errors_name_the_kernel() {
    let Some((dev, c)) = gpu() else { return };
    let k = schedule(&tilec_cuda::handbuilt::softmax(4, 64, DType::F32), true);
    let loaded = load_kernels(&dev, &c, &[k]).unwrap();
    let stream = dev.stream().unwrap();
    let e = loaded[0].launch(&stream, &[0]).unwrap_err().to_string();
    assert!(e.contains("softmax_f32") && e.contains("2 expected"), "{e}");
    let m = std::sync::Arc::new(
        dev.load_module(
            &c.compile(
                "softmax_f32",
                &render_cuda(&schedule(
                    &tilec_cuda::handbuilt::softmax(4, 64, DType::F32),
                    true,
                ))
                .unwrap(),
            )
            .unwrap()
            .image,
        )
        .unwrap(),
    );
    let e = m.function("no_such_kernel").unwrap_err().to_string();
    assert!(
        e.contains("cuModuleGetFunction") && e.contains("no_such_kernel"),
        "{e}"
    );
}
