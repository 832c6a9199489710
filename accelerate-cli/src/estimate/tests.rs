//! Unit tests of `estimate-memory`: arguments, sizes, rows and local folders.

use std::fs;

use clap::Parser;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: EstimateArgs,
}

fn parse(argv: &[&str]) -> EstimateArgs {
    Cli::try_parse_from(["estimate-memory"].iter().chain(argv))
        .expect("valid arguments")
        .args
}

fn tensors(list: &[(&str, u64)]) -> Tensors {
    list.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect()
}

/// A scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    tempfile::Builder::new()
        .prefix(&format!("accel-estimate-{name}-"))
        .tempdir()
        .expect("scratch dir")
        .keep()
}

/// Writes a safetensors file of F16 tensors (zeros) with a padded header.
fn write_safetensors(path: &Path, list: &[(&str, &[u64])]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0;
    for (name, shape) in list {
        let len = shape.iter().product::<u64>() * 2;
        header.insert(
            (*name).into(),
            serde_json::json!({"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut text = serde_json::to_string(&header).expect("json");
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend(text.as_bytes());
    bytes.resize(bytes.len() + offset as usize, 0);
    fs::write(path, bytes).expect("write safetensors");
}

#[test]
fn arguments_take_accelerates_spellings_and_defaults() {
    let args = parse(&["bert-base-cased"]);
    assert_eq!(args.model_name, "bert-base-cased");
    assert_eq!(
        args.dtypes,
        [Dtype::Float32, Dtype::Float16, Dtype::Int8, Dtype::Int4]
    );
    assert!(!args.trust_remote_code && args.library_name.is_none());
    let args = parse(&[
        "m",
        "--library-name",
        "timm",
        "--trust-remote-code",
        "--dtypes",
        "int4",
        "float32",
    ]);
    assert_eq!(args.library_name, Some(Library::Timm));
    assert!(args.trust_remote_code);
    assert_eq!(args.dtypes, [Dtype::Int4, Dtype::Float32]);
    let args = parse(&["m", "--library_name", "transformers", "--trust_remote_code"]);
    assert_eq!(args.library_name, Some(Library::Transformers));
    // As with argparse, a repeated --dtypes replaces the earlier one.
    let args = parse(&["m", "--dtypes", "int8", "--dtypes", "float16"]);
    assert_eq!(args.dtypes, [Dtype::Float16]);
    assert!(Cli::try_parse_from(["e", "m", "--dtypes", "bfloat16"]).is_err());
    assert!(Cli::try_parse_from(["e", "m", "--library_name", "diffusers"]).is_err());
}

#[test]
fn sizes_count_four_bytes_and_the_largest_leaf_module() {
    let (total, largest) = measure(&tensors(&[
        ("embed.weight", 100),
        ("layers.0.fc.weight", 30),
        ("layers.0.fc.bias", 5),
        ("layers.1.fc.weight", 30),
        // Held by a module with children: counts in the total, in no layer.
        ("layers.scale", 1000),
        ("norm.weight", 10),
    ]))
    .expect("sizes");
    assert_eq!(total, 4 * 1175);
    assert_eq!(largest, 4 * 100);
    // A tensor of the model itself is a layer of its own.
    let (_, largest) = measure(&tensors(&[("a.w", 10), ("a.b", 10), ("top", 15)])).expect("sizes");
    assert_eq!(largest, 4 * 20);
    let (_, largest) = measure(&tensors(&[("a.w", 10), ("top", 25)])).expect("sizes");
    assert_eq!(largest, 4 * 25);
    assert_eq!(measure(&Tensors::new()).expect("sizes"), (0, 0));
    assert!(matches!(
        measure(&tensors(&[("a", u64::MAX / 2)])),
        Err(EstimateError::TooLarge)
    ));
}

#[test]
fn rows_follow_accelerates_formulas() {
    // bert-base-cased: 108,310,272 parameters plus two 512-element int64
    // buffers (accelerate counts those at 8 bytes); word embeddings 28,996 x 768.
    let all = [Dtype::Float32, Dtype::Float16, Dtype::Int8, Dtype::Int4];
    let rows = rows(&all, 108_310_272 * 4 + 2 * 512 * 8, 28_996 * 768 * 4).expect("rows");
    let expected = table::BERT_BASE_CASED;
    let title = "Memory Usage for loading `bert-base-cased`";
    assert_eq!(ascii_table(&HEADERS, &rows, title), expected);
    // Whole bytes print as integers, halves as floats.
    let small = super::rows(&[Dtype::Float16, Dtype::Float32], 100, 20).expect("rows");
    assert_eq!(
        small[0],
        ["float16", "10.0 bytes", "50.0 bytes", "200 bytes"]
    );
    assert_eq!(small[1], ["float32", "20 bytes", "100 bytes", "400 bytes"]);
}

#[test]
fn a_local_folder_is_read_from_its_headers_single_or_sharded() {
    let dir = scratch("folders");
    let single = dir.join("single");
    fs::create_dir_all(&single).expect("dir");
    let all: [(&str, &[u64]); 3] = [
        ("embed.weight", &[64, 16]),
        ("layers.0.fc.weight", &[16, 16]),
        ("head.bias", &[64]),
    ];
    write_safetensors(&single.join("model.safetensors"), &all);
    let sharded = dir.join("shards");
    fs::create_dir_all(&sharded).expect("dir");
    write_safetensors(&sharded.join("a.safetensors"), &all[..1]);
    write_safetensors(&sharded.join("b.safetensors"), &all[1..]);
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": {
        "embed.weight": "a.safetensors", "layers.0.fc.weight": "b.safetensors", "head.bias": "b.safetensors"}});
    fs::write(sharded.join(safetensors::INDEX), index.to_string()).expect("index");
    let env = |_: &str| None;
    let run_on = |p: &Path, dtypes: &[&str]| {
        let mut argv = vec![p.to_str().expect("utf-8 path"), "--dtypes"];
        argv.extend(dtypes);
        run(&parse(&argv), &env).expect("estimate")
    };
    let from_single = run_on(&single, &["float32"]);
    assert!(
        from_single.contains(" 4.0 KB ") && from_single.contains(" 5.25 KB "),
        "{from_single}"
    );
    let from_sharded = run_on(&sharded, &["float32"]);
    assert_eq!(
        from_single.replace(single.to_str().unwrap_or_default(), "X"),
        from_sharded.replace(sharded.to_str().unwrap_or_default(), "X")
    );
    // A file or an index may be given directly.
    let direct = run_on(&single.join("model.safetensors"), &["int4"]);
    assert!(direct.contains("│ int4│"), "{direct}");
    run_on(&sharded.join(safetensors::INDEX), &["int8"]);
    // An index naming a missing shard, or a tensor its shard lacks.
    fs::remove_file(sharded.join("a.safetensors")).expect("rm");
    let err =
        run(&parse(&[sharded.to_str().unwrap_or_default()]), &env).expect_err("missing shard");
    assert!(err.to_string().contains("a.safetensors"), "{err}");
    write_safetensors(&sharded.join("a.safetensors"), &all[1..2]);
    let err = run(&parse(&[sharded.to_str().unwrap_or_default()]), &env).expect_err("bad index");
    assert!(
        err.to_string()
            .contains("`embed.weight` is listed in a.safetensors"),
        "{err}"
    );
}

#[test]
fn unusable_paths_and_files_say_what_to_do() {
    let dir = scratch("errors");
    let env = |_: &str| None;
    let attempt = |p: &Path| {
        run(&parse(&[p.to_str().unwrap_or_default()]), &env)
            .expect_err("error")
            .to_string()
    };
    let err = attempt(&dir.join("no/such/model"));
    assert!(err.contains("not an existing path"), "{err}");
    fs::write(dir.join("pytorch_model.bin"), b"pickle").expect("write");
    let err = attempt(&dir);
    assert!(
        err.contains("no model.safetensors") && err.contains("PyTorch pickle"),
        "{err}"
    );
    write_safetensors(&dir.join("other.safetensors"), &[("w", &[2])]);
    let err = attempt(&dir);
    assert!(err.contains("other.safetensors: pass the file"), "{err}");
    let file = dir.join("model.safetensors");
    fs::write(&file, b"tiny").expect("write");
    let err = attempt(&dir);
    assert!(
        err.contains("model.safetensors is not a valid safetensors file")
            && err.contains("too short"),
        "{err}"
    );
    fs::write(&file, 1000u64.to_le_bytes()).expect("write");
    assert!(attempt(&dir).contains("runs past the end"));
    fs::write(&file, u64::MAX.to_le_bytes()).expect("write");
    assert!(attempt(&dir).contains("exceeds safetensors' limit"));
    write_safetensors(&file, &[("w", &[1024])]);
    let bytes = fs::read(&file).expect("read");
    fs::write(&file, &bytes[..bytes.len() - 1]).expect("truncate");
    assert!(attempt(&dir).contains("truncated file"));
    fs::write(dir.join(safetensors::INDEX), "{\"weight_map\": 3}").expect("write");
    assert!(attempt(&dir).contains("no \"weight_map\" object"));
}
