//! A forward through the fast forms that captures a tensor or module does not compile, and
//! the compiler's message names what to write instead (`tests/compile_fail/*.rs`, with the
//! expected messages beside them). A change to rustc's wording fails these tests: update the
//! `.stderr` files with `TRYBUILD=overwrite cargo test --test compile_fail` and read them.

#[test]
fn capturing_forwards_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/compile_fail/*.rs");
}

/// Every expected message names the forms a user can turn to.
#[test]
fn messages_name_the_form_to_use() {
    let mut checked = 0;
    for entry in std::fs::read_dir("tests/compile_fail").expect("the cases") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "stderr") {
            let text = std::fs::read_to_string(&path).expect("a message");
            assert!(
                text.contains("captured here") && text.contains("`Broadcast`"),
                "{}: names the capture and `Broadcast`",
                path.display()
            );
            assert!(
                text.contains("forward_with_captures"),
                "{}: names the capturing form",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "{checked} messages");
}
