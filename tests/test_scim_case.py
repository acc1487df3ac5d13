"""A PATCH path filter compares the sub-attributes the schema publishes as caseExact false
without regard to the case of ASCII letters (RFC 7644 s3.4.2.2), as Entra ID expects when
it sends `emails[type eq "Work"]` for an email of type "work"."""

from __future__ import annotations

from tests.helpers.scim import Scim


def test_a_patch_filter_ignores_the_case_of_a_case_insensitive_sub_attribute(acme: Scim) -> None:
    ann = acme.user("case-ann", emails=[{"value": "a@example.com", "type": "work"}])
    replaced = acme.patch(
        f"/Users/{ann}",
        {"op": "Replace", "path": 'emails[type eq "Work"].value', "value": "b@example.com"},
    )
    assert replaced.status_code == 200, replaced.text
    # The one email changed, not a second one added beside it.
    assert replaced.json()["emails"] == [{"value": "b@example.com", "type": "work"}]
    removed = acme.patch(f"/Users/{ann}", {"op": "remove", "path": 'emails[type eq "WORK"]'})
    assert removed.status_code == 200, removed.text
    assert "emails" not in acme("GET", f"/Users/{ann}").json()


def test_a_groups_display_name_is_published_and_filtered_as_case_exact(acme: Scim) -> None:
    """A group's displayName is its principal, `group:<displayName>`, compared exactly
    where access is decided, and two groups may differ in case alone: the schema says so
    (caseExact true), so an IdP looking a group up by name does not expect the filter to
    fold case, and never gets the other group's id."""
    schema = acme("GET", "/Schemas/urn:ietf:params:scim:schemas:core:2.0:Group").json()
    by_name = {a["name"]: a for a in schema["attributes"]}
    assert by_name["displayName"]["caseExact"] is True
    upper, lower = acme.group("Case-Finance"), acme.group("case-finance")
    found = acme("GET", '/Groups?filter=displayName eq "case-finance"').json()
    assert [g["id"] for g in found["Resources"]] == [lower] and upper != lower
