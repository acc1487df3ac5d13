"""`gateway keys`: API keys for service callers, created, listed and revoked by an admin."""

from __future__ import annotations

from typing import Annotated

import typer

from gateway.cli.options import DataDirOption, catalog_of, fail, settings_from_env


def keys_create(
    tenant: Annotated[str, typer.Option(help="The only tenant the key reads.")],
    region: Annotated[
        str | None,
        typer.Option(help="The key's region (policy region rules apply); not for scim keys."),
    ] = None,
    principal: Annotated[
        list[str] | None,
        typer.Option(help="A principal the key reads as, e.g. group:search-bot; repeat."),
    ] = None,
    name: Annotated[str, typer.Option(help="What the key is for, shown by `keys list`.")] = "",
    expires_days: Annotated[
        int | None, typer.Option(help="Days until the key stops working; never by default.")
    ] = None,
    scope: Annotated[
        str,
        typer.Option(
            help="search: the read routes; ingest: the ingest routes only; scim: the "
            "directory at /scim/v2 only (an identity provider's provisioning)."
        ),
    ] = "search",
    doc_prefix: Annotated[
        str | None,
        typer.Option(
            help="An ingest key writes only doc_ids starting with this, e.g. hr/ or acme-hr-: "
            "a plain string prefix, so end it with a separator (acme-hr also covers acme-hr2-...)."
        ),
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Create a key scoped to exactly this tenant, region and these principals; prints it once."""
    from gateway.authn.apikeys import create_key

    if region is None and scope != "scim":
        fail("key not created: --region is required for a search or ingest key")
    catalog = catalog_of(settings_from_env(data_dir), "key not created", may_create=True)
    try:
        token, row = create_key(
            catalog,
            tenant=tenant,
            region=region or "",
            principals=principal or [],
            name=name,
            expires_days=expires_days,
            scope=scope,
            doc_prefix=doc_prefix,
        )
    except ValueError as exc:
        fail(f"key not created: {exc}")
    limit = f" for doc_ids starting {row.doc_prefix!r}" if row.doc_prefix is not None else ""
    if row.doc_prefix is not None and not row.doc_prefix.endswith(PREFIX_SEPARATORS):
        # A plain string prefix, as documented: said, not refused, since a deployment's IDs
        # may be meant that way (DOC123 under DOC).
        typer.echo(
            f"note: the prefix {row.doc_prefix!r} does not end with one of "
            f"{' '.join(PREFIX_SEPARATORS)}: this key also writes doc_ids such as "
            f"{row.doc_prefix + '2-x'!r}; for one namespace, create a key with "
            f"{row.doc_prefix + '-'!r} or {row.doc_prefix + '/'!r} and revoke this one",
            err=True,
        )
    typer.echo(
        f"created {row.scope} key {row.key_id}{limit}; it is shown once, store it now:\n{token}"
    )


# What usually ends a namespace of doc_ids (`hr/`, `acme-hr-`).
PREFIX_SEPARATORS = ("/", "-", "_", ":", ".")


def keys_list(data_dir: DataDirOption = None) -> None:
    """Every key with its scope and state; never a secret."""

    rows = catalog_of(settings_from_env(data_dir), "keys list").api_keys()
    typer.echo(
        "key_id            state    scope   tenant  region  principals  name  created  expires"
        "  doc_prefix"
    )
    for r in rows:
        state = "revoked" if r.revoked_at else "active"
        expires = r.expires_at.date().isoformat() if r.expires_at else "never"
        typer.echo(
            f"{r.key_id}  {state:7}  {r.scope:6}  {r.tenant}  {r.region}  "
            f"{','.join(r.principals) or '-'}  "
            f"{r.name or '-'}  {r.created_at.date().isoformat()}  {expires}  "
            f"{r.doc_prefix if r.doc_prefix is not None else '-'}"
        )


def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's ID, as `keys list` shows it.")],
    data_dir: DataDirOption = None,
) -> None:
    """Revoke a key: the next request made with it is refused."""
    import datetime as dt

    catalog = catalog_of(settings_from_env(data_dir), "keys revoke")
    row = catalog.revoke_api_key(key_id, dt.datetime.now(dt.UTC))
    if row is None:
        fail(f"no key {key_id!r}")
    typer.echo(f"key {key_id} revoked at {row.revoked_at}")


def keys_adopt(
    key_id: Annotated[str, typer.Argument(help="The ingest key's ID, as `keys list` shows it.")],
    all_versions: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Also the versions it did not push (gateway ingest's, an admin's), within "
            "its doc_id prefix.",
        ),
    ] = False,
    data_dir: DataDirOption = None,
) -> None:
    """Hand to an ingest key the documents of its tenant (within its doc_id prefix) that
    have no recorded pusher and that it pushed itself, before pushers were recorded; with
    --all, also those written by `gateway ingest` or pushed by an admin. An ingest key
    changes and deletes only documents it holds."""
    catalog = catalog_of(settings_from_env(data_dir), "keys adopt")
    row = catalog.api_key(key_id)
    if row is None or row.scope != "ingest":
        fail(f"no ingest key {key_id!r}")
    subject = f"key:{row.key_id}"
    versions = catalog.owners.adopt(row.tenant, subject, row.doc_prefix, all_versions)
    typer.echo(f"key {key_id} now holds {versions} versions of tenant {row.tenant}")
    left = catalog.owners.unowned(row.tenant)
    if left and not all_versions:
        typer.echo(
            f"{left} versions of the tenant still have no recorded pusher (not this key's "
            "pushes, or outside its prefix); --all hands over those inside its prefix",
            err=True,
        )
