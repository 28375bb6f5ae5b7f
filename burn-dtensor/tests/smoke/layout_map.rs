//! LayoutMap on real `burn::nn` modules: paths, layouts, kept parameter ids, error cases, and
//! re-layout of loaded records.

use burn::backend::NdArray;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Tensor, Tolerance};
use burn_dtensor::*;

#[derive(Module, Debug)]
struct Mlp<B: burn::tensor::backend::Backend> {
    dense1: Linear<B>,
    dense2: Linear<B>,
}

type Bk = DistributedBackend<NdArray>;

fn setup() -> (Mesh<burn::backend::ndarray::NdArrayDevice>, Mlp<Bk>) {
    let mesh = Mesh::virtual_devices([("batch", 2), ("model", 2)], Default::default()).unwrap();
    let dev = DistributedDevice::new(mesh.clone());
    // The decorator's random stream is process-global and shared with `smoke`'s seeded tests.
    let _rng = crate::rng_lock();
    (
        mesh,
        Mlp {
            dense1: LinearConfig::new(6, 4).init(&dev),
            dense2: LinearConfig::new(4, 3).init(&dev),
        },
    )
}

#[test]
fn applies_first_matching_rule_keeps_ids_and_values() {
    let (mesh, m) = setup();
    let before = (
        m.dense1.weight.id,
        m.dense1.weight.val().into_data(),
        m.dense2.weight.val().into_data(),
    );
    let map = LayoutMap::from_toml_str(
        "'^dense1\\.weight$' = [\"unsharded\", \"model\"]\n'weight' = [\"model\", \"unsharded\"]\n",
    )
    .unwrap();
    let (m, report) = map.apply(m, mesh.topology()).unwrap();
    let paths: Vec<&str> = report.assignments.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "dense1.weight",
            "dense1.bias",
            "dense2.weight",
            "dense2.bias"
        ]
    );
    assert_eq!(
        m.dense1.weight.val().layout(),
        Layout::new(&mesh, ["unsharded", "model"]).unwrap()
    );
    assert_eq!(
        m.dense2.weight.val().layout(),
        Layout::new(&mesh, ["model", "unsharded"]).unwrap()
    );
    assert!(
        (m.dense1.bias.as_ref().unwrap().val())
            .layout()
            .is_replicated()
    );
    assert_eq!(
        m.dense1.weight.id, before.0,
        "parameter ids must survive (optimizer state)"
    );
    m.dense1.weight.val().into_data().assert_eq(&before.1, true);
    m.dense2.weight.val().into_data().assert_eq(&before.2, true);
    // Forward equals the plain backend's with the same weights.
    let x = Tensor::<Bk, 2>::ones([5, 6], &DistributedDevice::new(mesh.clone()));
    let y = m.dense2.forward(m.dense1.forward(x));
    let dev = Default::default();
    let w1 = Tensor::<NdArray, 2>::from_data(before.1, &dev);
    let w2 = Tensor::<NdArray, 2>::from_data(before.2, &dev);
    let b1 =
        Tensor::<NdArray, 1>::from_data(m.dense1.bias.as_ref().unwrap().val().into_data(), &dev);
    let b2 =
        Tensor::<NdArray, 1>::from_data(m.dense2.bias.as_ref().unwrap().val().into_data(), &dev);
    let yr = (Tensor::<NdArray, 2>::ones([5, 6], &dev).matmul(w1) + b1.unsqueeze()).matmul(w2)
        + b2.unsqueeze();
    y.into_data()
        .assert_approx_eq::<f32>(&yr.into_data(), Tolerance::default());
}

#[test]
fn loaded_records_are_relaid_out() {
    let (mesh, m) = setup();
    let expected = m.dense2.weight.val().into_data(); // materialise the lazy weights once
    let record = m.into_record();
    let map = LayoutMap::new()
        .rule("^dense2\\.weight$", ["model", "unsharded"])
        .unwrap();
    let (fresh, _) = map.apply(setup().1, mesh.topology()).unwrap();
    let loaded = fresh.load_record(record);
    assert_eq!(
        loaded.dense2.weight.val().layout(),
        Layout::new(&mesh, ["model", "unsharded"]).unwrap()
    );
    loaded
        .dense2
        .weight
        .val()
        .into_data()
        .assert_eq(&expected, true);
}

#[test]
fn errors_name_the_problem() {
    let (mesh, m) = setup();
    let e = LayoutMap::new()
        .rule("^dense9\\.", ["model"])
        .unwrap()
        .apply(m.clone(), mesh.topology())
        .unwrap_err();
    assert!(
        matches!(&e, DTensorError::UnmatchedRule { patterns, paths } if patterns.contains("dense9") && paths.contains("dense1.weight")),
        "{e}"
    );
    let e = LayoutMap::new()
        .rule("dense1\\.weight", ["model"])
        .unwrap()
        .apply(m.clone(), mesh.topology())
        .unwrap_err();
    assert!(
        matches!(
            e,
            DTensorError::RuleRankMismatch {
                layout_rank: 1,
                param_rank: 2,
                ..
            }
        ),
        "{e}"
    );
    let e = LayoutMap::new()
        .rule("dense1\\.weight", ["unsharded", "tensor"])
        .unwrap()
        .apply(m.clone(), mesh.topology())
        .unwrap_err();
    assert!(matches!(e, DTensorError::UnknownAxis { .. }), "{e}");
    let e = LayoutMap::new()
        .rule("dense1\\.weight", ["model", "model"])
        .unwrap()
        .apply(m, mesh.topology())
        .unwrap_err();
    assert!(matches!(e, DTensorError::AxisUsedTwice { .. }), "{e}");
    // Applied for another mesh than the module's (before: a panic inside the relayout), for
    // lazy parameters and for materialised ones.
    let other = Mesh::<burn::backend::ndarray::NdArrayDevice>::virtual_devices(
        [("batch", 4)],
        Default::default(),
    )
    .unwrap();
    let map = LayoutMap::new()
        .rule("weight", ["unsharded", "batch"])
        .unwrap();
    let (_, lazy) = setup();
    let materialised = setup().1.fork(&DistributedDevice::new(mesh.clone()));
    let _ = materialised.dense1.weight.val();
    for m in [lazy, materialised] {
        let e = map.apply(m, other.topology()).unwrap_err();
        assert!(
            matches!(&e, DTensorError::ModuleOnOtherMesh { path, mesh, .. } if path == "dense1.weight" && mesh == "batch=4"),
            "{e}"
        );
        assert!(e.to_string().contains("batch=2,model=2"), "{e}");
    }
    assert!(matches!(
        LayoutMap::new().rule("(", ["model"]),
        Err(DTensorError::InvalidRegex { .. })
    ));
    assert!(matches!(
        LayoutMap::from_toml_str("'a' = \"model\""),
        Err(DTensorError::LayoutMapFile { .. })
    ));
}

/// A TOML syntax error names its line and column; a layout-map file with no rule is refused
/// (it would silently replicate every parameter); the empty map in code stays valid.
#[test]
fn file_errors_give_line_and_column_and_refuse_an_empty_map() {
    let e = LayoutMap::from_toml_str(
        "'^dense1\\.weight$' = [\"unsharded\", \"model\"]\n'^dense2' = [\"model\" \"x\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 2, column"), "{e}");
    let e = LayoutMap::from_toml_str("'a' = [\"model\"]\nnot toml at all\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2, column 5"), "{e}");
    let dir = std::env::temp_dir().join(format!("layout-map-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for text in [
        "",
        "# every rule commented out\n# '^dense1' = [\"model\"]\n",
    ] {
        let f = dir.join("map.toml");
        std::fs::write(&f, text).unwrap();
        let e = LayoutMap::from_file(&f).unwrap_err();
        assert!(
            matches!(&e, DTensorError::LayoutMapFile { reason, .. } if reason.contains("no rule")),
            "{e}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(LayoutMap::from_toml_str("").unwrap().rules().is_empty());
}
