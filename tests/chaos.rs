//! The chaos example is deterministic, as its docs claim: the same seed
//! prints the same table and draws the same picture.

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/chaos.rs"]
mod chaos;

#[test]
fn the_same_seed_gives_the_same_table_and_picture() {
    let first = chaos::chaos(7, 1_500);
    let second = chaos::chaos(7, 1_500);
    let table = chaos::table(&first);
    assert_eq!(table, chaos::table(&second));
    assert_eq!(chaos::svg(&first), chaos::svg(&second));
    // The full stack answered every call; the table says so.
    assert!(table.contains("| full stack | 100.0 % |"), "{table}");
    assert!(chaos::svg(&first).starts_with("<svg"));
}
