//! The Linux tray icon, exported straight onto the session bus with zbus:
//! a StatusNotifierItem and its com.canonical.dbusmenu menu.
//!
//! Why not libayatana-appindicator: it is a C library built on GTK, so the
//! process that shows the icon loads GTK, and in a Tauri app WebKit with
//! it. Exporting the two D-Bus objects ourselves (no tauri, GTK or C
//! library here) lets a tray process run without either, while the window
//! lives in a process of its own.
//!
//! Why it looks like libayatana on the bus: tray hosts (KDE, the GNOME
//! AppIndicator extension, waybar...) and our own desktop tests
//! (`tests/desktop/desktop.py`) already read what libayatana exported, so
//! the bus name (`org.kde.StatusNotifierItem-<pid>-1`), the object paths
//! (`/org/ayatana/NotificationItem/speedtap` and its `/Menu`), the
//! Ayatana label properties and the dbusmenu ids and properties are kept
//! as they were.
//!
//! The menu is a flat list of [`MenuEntry`]s. Its dbusmenu ids are the
//! positions 1..n in the current list; a list of another shape (other ids
//! or kinds) is a new layout revision, a list of the same shape is updated
//! in place (see `menu_change`). A click that names an id the current
//! layout does not have is refused with "does not refer to a menu item",
//! as libdbusmenu did, so a host (or test) that raced a relayout knows
//! nothing happened and can read the layout again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::StreamExt;
use serde::{Serialize, Serializer};
use zbus::object_server::{InterfaceRef, SignalEmitter};
use zbus::{fdo, interface, Connection, MatchRule, MessageStream, ObjectPath, OwnedVariant};
use zbus::{Signature, Type};

use crate::tray_model::{EntryKind, MenuEntry};

/// Where libayatana put an indicator with the id `speedtap`.
const ITEM_PATH: &str = "/org/ayatana/NotificationItem/speedtap";
/// Where libayatana put that indicator's menu.
const MENU_PATH: &str = "/org/ayatana/NotificationItem/speedtap/Menu";
const ITEM_ID: &str = "speedtap";
const WATCHER: &str = "org.kde.StatusNotifierWatcher";
const WATCHER_PATH: &str = "/StatusNotifierWatcher";

/// The message of the error a click on an unknown id gets; the desktop
/// tests retry on exactly this text.
const NOT_AN_ITEM: &str = "does not refer to a menu item";

/// A tray icon as StatusNotifierItem sends it: ARGB32, each pixel four
/// bytes A, R, G, B (network byte order, as the spec asks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Icon {
    pub width: i32,
    pub height: i32,
    pub argb: Vec<u8>,
}

/// Why a PNG could not become an [`Icon`].
#[derive(Debug, thiserror::Error)]
pub enum IconError {
    #[error("cannot decode the PNG: {0}")]
    Decode(#[from] png::DecodingError),
    #[error("PNG pixel format {0:?} is not supported")]
    Format(png::ColorType),
    #[error("PNG is too large for a tray icon")]
    TooLarge,
}

impl Icon {
    /// Decodes a PNG (RGBA8 as the tray icons are; RGB, grey and palette
    /// images are widened to it) into ARGB32 big-endian.
    pub fn from_png(bytes: &[u8]) -> Result<Icon, IconError> {
        let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        decoder.set_transformations(png::Transformations::normalize_to_color8());
        let mut reader = decoder.read_info()?;
        let size = reader.output_buffer_size().ok_or(IconError::TooLarge)?;
        let mut buf = vec![0; size];
        let info = reader.next_frame(&mut buf)?;
        let pixels = buf.get(..info.buffer_size()).ok_or(IconError::TooLarge)?;
        Ok(Icon {
            width: i32::try_from(info.width).map_err(|_| IconError::TooLarge)?,
            height: i32::try_from(info.height).map_err(|_| IconError::TooLarge)?,
            argb: to_argb(pixels, info.color_type)?,
        })
    }
}

/// Reorders 8-bit pixels of `color` into A, R, G, B.
fn to_argb(pixels: &[u8], color: png::ColorType) -> Result<Vec<u8>, IconError> {
    use png::ColorType::*;
    let argb = |chunk: &[u8]| -> [u8; 4] {
        match (color, chunk) {
            (Rgba, &[r, g, b, a]) => [a, r, g, b],
            (Rgb, &[r, g, b]) => [255, r, g, b],
            (GrayscaleAlpha, &[v, a]) => [a, v, v, v],
            (_, &[v]) => [255, v, v, v],
            _ => [0; 4],
        }
    };
    let channels = match color {
        Rgba => 4,
        Rgb => 3,
        GrayscaleAlpha => 2,
        Grayscale => 1,
        Indexed => return Err(IconError::Format(color)),
    };
    Ok(pixels.chunks_exact(channels).flat_map(argb).collect())
}

/// One dbusmenu property value. Its own type rather than a generic
/// variant so the layout stays plain data the tests can compare.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Prop {
    Str(String),
    Bool(bool),
    Int(i32),
}

impl Serialize for Prop {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        match self {
            Prop::Str(s) => zbus::as_variant::serialize(s, ser),
            Prop::Bool(b) => zbus::as_variant::serialize(b, ser),
            Prop::Int(i) => zbus::as_variant::serialize(i, ser),
        }
    }
}

impl Type for Prop {
    const SIGNATURE: &'static Signature = &Signature::Variant;
}

/// A menu item's properties (`a{sv}`).
type Props = BTreeMap<&'static str, Prop>;

/// A dbusmenu layout node, `(ia{sv}av)`.
#[derive(Debug, PartialEq, Serialize, Type)]
struct Node {
    id: i32,
    props: Props,
    children: Vec<Child>,
}

/// A child node: dbusmenu wraps each one in a variant.
#[derive(Debug, PartialEq)]
struct Child(Node);

impl Serialize for Child {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        zbus::as_variant::serialize(&self.0, ser)
    }
}

impl Type for Child {
    const SIGNATURE: &'static Signature = &Signature::Variant;
}

/// The properties of one entry, as libdbusmenu-gtk exported a GTK item.
fn entry_props(entry: &MenuEntry) -> Props {
    let mut props = Props::new();
    props.insert("visible", Prop::Bool(true));
    if entry.kind == EntryKind::Separator {
        props.insert("type", Prop::Str("separator".into()));
        return props;
    }
    // dbusmenu reads "_" as the mnemonic mark; "__" is a literal one.
    props.insert("label", Prop::Str(entry.text.replace('_', "__")));
    props.insert("enabled", Prop::Bool(entry.kind != EntryKind::Info));
    if let EntryKind::Check(checked) = entry.kind {
        props.insert("toggle-type", Prop::Str("checkmark".into()));
        props.insert("toggle-state", Prop::Int(i32::from(checked)));
    }
    props
}

/// Keeps only the properties asked for (all when none are named).
fn filter_props(mut props: Props, names: &[String]) -> Props {
    if !names.is_empty() {
        props.retain(|k, _| names.iter().any(|n| n == k));
    }
    props
}

/// The properties of the item `id` (0 is the root), or None when the
/// current menu has no such item.
fn item_props(menu: &[MenuEntry], id: i32) -> Option<Props> {
    if id == 0 {
        let mut root = Props::new();
        root.insert("children-display", Prop::Str("submenu".into()));
        return Some(root);
    }
    let index = usize::try_from(id).ok()?.checked_sub(1)?;
    menu.get(index).map(entry_props)
}

/// The layout below `parent` as GetLayout returns it: the entries are the
/// root's children, and have none of their own. A `depth` of 0 asks for
/// the node alone, -1 (or more than 0) for its children too.
fn layout(menu: &[MenuEntry], parent: i32, depth: i32, names: &[String]) -> Option<Node> {
    let props = filter_props(item_props(menu, parent)?, names);
    let mut children = Vec::new();
    if parent == 0 && depth != 0 {
        for (id, entry) in (1..).zip(menu) {
            children.push(Child(Node {
                id,
                props: filter_props(entry_props(entry), names),
                children: Vec::new(),
            }));
        }
    }
    Some(Node {
        id: parent,
        props,
        children,
    })
}

/// What a new menu changes for a host that shows the old one.
#[derive(Debug, PartialEq, Eq)]
enum MenuChange {
    /// Nothing: no signal.
    None,
    /// Other ids or kinds, in another order or number: a new layout.
    Layout,
    /// The same shape with these dbusmenu ids showing other texts or
    /// check marks: their properties are sent again.
    Items(Vec<i32>),
}

fn menu_change(old: &[MenuEntry], new: &[MenuEntry]) -> MenuChange {
    let same_shape = old.len() == new.len()
        && old.iter().zip(new).all(|(a, b)| {
            a.id == b.id && std::mem::discriminant(&a.kind) == std::mem::discriminant(&b.kind)
        });
    if !same_shape {
        return MenuChange::Layout;
    }
    let changed: Vec<i32> = (1..)
        .zip(old.iter().zip(new))
        .filter(|(_, (a, b))| a != b)
        .map(|(id, _)| id)
        .collect();
    if changed.is_empty() {
        MenuChange::None
    } else {
        MenuChange::Items(changed)
    }
}

/// What the tray shows now.
struct State {
    label: String,
    icon: Icon,
    menu: Vec<MenuEntry>,
    /// The dbusmenu layout revision, bumped on each new layout.
    revision: u32,
}

/// The state and the callbacks, shared by the two exported objects and
/// every [`Tray`] handle.
struct Shared {
    state: Mutex<State>,
    on_click: Box<dyn Fn(String) + Send + Sync>,
    on_activate: Box<dyn Fn() + Send + Sync>,
}

impl Shared {
    /// The state; a panic elsewhere while holding it leaves data that is
    /// still whole (every change is one assignment), so poisoning is
    /// ignored.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Icons as StatusNotifierItem sends them, `a(iiay)`: width, height and
/// ARGB32 pixels, one entry per size (we have one).
type Pixmaps = Vec<(i32, i32, Vec<u8>)>;

/// `org.kde.StatusNotifierItem` at [`ITEM_PATH`].
struct Item(Arc<Shared>);

#[interface(name = "org.kde.StatusNotifierItem")]
impl Item {
    /// A left click, on hosts that send one (others only open the menu).
    fn activate(&self, _x: i32, _y: i32) {
        (self.0.on_activate)();
    }

    fn secondary_activate(&self, _x: i32, _y: i32) {}

    /// The menu is exported (ItemIsMenu), so hosts draw it themselves.
    fn context_menu(&self, _x: i32, _y: i32) {}

    fn scroll(&self, _delta: i32, _orientation: String) {}

    #[zbus(property)]
    fn category(&self) -> String {
        "ApplicationStatus".into()
    }

    #[zbus(property)]
    fn id(&self) -> String {
        ITEM_ID.into()
    }

    #[zbus(property)]
    fn title(&self) -> String {
        ITEM_ID.into()
    }

    #[zbus(property)]
    fn status(&self) -> String {
        "Active".into()
    }

    #[zbus(property)]
    fn window_id(&self) -> i32 {
        0
    }

    #[zbus(property)]
    fn icon_name(&self) -> String {
        String::new()
    }

    #[zbus(property)]
    fn icon_pixmap(&self) -> Pixmaps {
        let state = self.0.state();
        let icon = &state.icon;
        vec![(icon.width, icon.height, icon.argb.clone())]
    }

    #[zbus(property)]
    fn icon_theme_path(&self) -> String {
        String::new()
    }

    #[zbus(property)]
    fn overlay_icon_name(&self) -> String {
        String::new()
    }

    #[zbus(property)]
    fn attention_icon_name(&self) -> String {
        String::new()
    }

    #[zbus(property)]
    fn attention_icon_pixmap(&self) -> Pixmaps {
        Vec::new()
    }

    #[zbus(property)]
    fn tool_tip(&self) -> (String, Pixmaps, String, String) {
        (String::new(), Vec::new(), ITEM_ID.into(), String::new())
    }

    #[zbus(property)]
    fn item_is_menu(&self) -> bool {
        true
    }

    #[zbus(property)]
    fn menu(&self) -> ObjectPath<'static> {
        ObjectPath::from_static_str_unchecked(MENU_PATH)
    }

    /// The text next to the icon: hosts that know the Ayatana extension
    /// show it (the tokens per second).
    #[zbus(property, name = "XAyatanaLabel")]
    fn x_ayatana_label(&self) -> String {
        self.0.state().label.clone()
    }

    #[zbus(property, name = "XAyatanaLabelGuide")]
    fn x_ayatana_label_guide(&self) -> String {
        String::new()
    }

    #[zbus(property, name = "XAyatanaOrderingIndex")]
    fn x_ayatana_ordering_index(&self) -> u32 {
        0
    }

    #[zbus(signal)]
    async fn new_title(emitter: &SignalEmitter<'_>) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn new_icon(emitter: &SignalEmitter<'_>) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn new_status(emitter: &SignalEmitter<'_>, status: &str) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn new_tool_tip(emitter: &SignalEmitter<'_>) -> zbus::Result<()>;

    #[zbus(signal, name = "XAyatanaNewLabel")]
    async fn x_ayatana_new_label(
        emitter: &SignalEmitter<'_>,
        label: &str,
        guide: &str,
    ) -> zbus::Result<()>;
}

/// `com.canonical.dbusmenu` at [`MENU_PATH`].
struct DbusMenu(Arc<Shared>);

fn not_an_item(id: i32) -> fdo::Error {
    fdo::Error::InvalidArgs(format!("the id {id} {NOT_AN_ITEM} of this layout"))
}

#[interface(name = "com.canonical.dbusmenu")]
impl DbusMenu {
    #[zbus(out_args("revision", "layout"))]
    fn get_layout(
        &self,
        parent_id: i32,
        recursion_depth: i32,
        property_names: Vec<String>,
    ) -> fdo::Result<(u32, Node)> {
        let state = self.0.state();
        let node = layout(&state.menu, parent_id, recursion_depth, &property_names);
        Ok((state.revision, node.ok_or_else(|| not_an_item(parent_id))?))
    }

    /// Unknown ids are left out, as libdbusmenu did.
    fn get_group_properties(
        &self,
        ids: Vec<i32>,
        property_names: Vec<String>,
    ) -> Vec<(i32, Props)> {
        let state = self.0.state();
        ids.into_iter()
            .filter_map(|id| {
                let props = item_props(&state.menu, id)?;
                Some((id, filter_props(props, &property_names)))
            })
            .collect()
    }

    fn get_property(&self, id: i32, name: String) -> fdo::Result<Prop> {
        let props = item_props(&self.0.state().menu, id).ok_or_else(|| not_an_item(id))?;
        props
            .get(name.as_str())
            .cloned()
            .ok_or_else(|| fdo::Error::InvalidArgs(format!("item {id} has no property {name}")))
    }

    /// "clicked" on an entry calls the click callback with its string id.
    /// Other events (opened, closed, hovered) need nothing.
    fn event(
        &self,
        id: i32,
        event_id: String,
        _data: OwnedVariant,
        _timestamp: u32,
    ) -> fdo::Result<()> {
        let clicked = self.clicked_entry(id)?;
        if event_id == "clicked" {
            if let Some(entry_id) = clicked {
                (self.0.on_click)(entry_id);
            }
        }
        Ok(())
    }

    /// Returns the ids it did not know.
    fn event_group(&self, events: Vec<(i32, String, OwnedVariant, u32)>) -> Vec<i32> {
        let mut unknown = Vec::new();
        for (id, event_id, data, timestamp) in events {
            if self.event(id, event_id, data, timestamp).is_err() {
                unknown.push(id);
            }
        }
        unknown
    }

    /// The menu is always up to date: nothing to do before it shows.
    fn about_to_show(&self, _id: i32) -> bool {
        false
    }

    #[zbus(out_args("updatesNeeded", "idErrors"))]
    fn about_to_show_group(&self, ids: Vec<i32>) -> (Vec<i32>, Vec<i32>) {
        let state = self.0.state();
        let unknown = ids
            .into_iter()
            .filter(|id| item_props(&state.menu, *id).is_none())
            .collect();
        (Vec::new(), unknown)
    }

    #[zbus(property)]
    fn version(&self) -> u32 {
        3
    }

    #[zbus(property)]
    fn text_direction(&self) -> String {
        "ltr".into()
    }

    #[zbus(property)]
    fn status(&self) -> String {
        "normal".into()
    }

    #[zbus(property)]
    fn icon_theme_path(&self) -> Vec<String> {
        Vec::new()
    }

    #[zbus(signal)]
    async fn layout_updated(
        emitter: &SignalEmitter<'_>,
        revision: u32,
        parent: i32,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn items_properties_updated(
        emitter: &SignalEmitter<'_>,
        updated: &[(i32, Props)],
        removed: &[(i32, Vec<String>)],
    ) -> zbus::Result<()>;
}

impl DbusMenu {
    /// The string id a click on `id` reports: None for the root, and for
    /// separators and greyed-out entries, which GTK never activated
    /// either; an error for an id the current layout does not have.
    fn clicked_entry(&self, id: i32) -> fdo::Result<Option<String>> {
        if id == 0 {
            return Ok(None);
        }
        let state = self.0.state();
        let index = usize::try_from(id).ok().and_then(|i| i.checked_sub(1));
        let entry = index
            .and_then(|i| state.menu.get(i))
            .ok_or_else(|| not_an_item(id))?;
        Ok(match entry.kind {
            EntryKind::Action | EntryKind::Check(_) => Some(entry.id.clone()),
            EntryKind::Info | EntryKind::Separator => None,
        })
    }
}

/// A handle on the exported tray icon. Cheap to clone; the icon stays on
/// the bus for as long as the process runs.
#[derive(Clone)]
pub struct Tray {
    conn: Connection,
    shared: Arc<Shared>,
}

impl Tray {
    /// Exports the icon and its menu on the session bus, and registers
    /// with the tray host now and whenever one (re)appears. Must run
    /// within a tokio runtime. The callbacks run on the D-Bus task: they
    /// should hand longer work to a task of their own.
    pub async fn start(
        label: &str,
        icon: Icon,
        menu: Vec<MenuEntry>,
        on_click: impl Fn(String) + Send + Sync + 'static,
        on_activate: impl Fn() + Send + Sync + 'static,
    ) -> zbus::Result<Tray> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                label: label.to_owned(),
                icon,
                menu,
                revision: 1,
            }),
            on_click: Box::new(on_click),
            on_activate: Box::new(on_activate),
        });
        let name = format!("org.kde.StatusNotifierItem-{}-1", std::process::id());
        let conn = zbus::connection::Builder::session()
            .name(name)
            .serve_at(ITEM_PATH, Item(Arc::clone(&shared)))
            .serve_at(MENU_PATH, DbusMenu(Arc::clone(&shared)))
            .build()
            .await?;
        // Listen before the first registration, so a host that appears in
        // between is not missed.
        let hosts = watcher_appearances(&conn).await?;
        register(&conn).await;
        tokio::spawn(reregister(conn.clone(), hosts));
        Ok(Tray { conn, shared })
    }

    /// Sets the text next to the icon; a no-op when it is unchanged.
    pub async fn set_label(&self, label: &str) {
        {
            let mut state = self.shared.state();
            if state.label == label {
                return;
            }
            state.label = label.to_owned();
        }
        let sent = async {
            let item = self.item().await?;
            Item::x_ayatana_new_label(item.signal_emitter(), label, "").await?;
            let iface = item.get().await;
            iface.x_ayatana_label_changed(item.signal_emitter()).await
        };
        if let Err(e) = sent.await {
            tracing::debug!("tray label change not signalled: {e}");
        }
    }

    /// Sets the icon; a no-op when it is unchanged.
    pub async fn set_icon(&self, icon: Icon) {
        {
            let mut state = self.shared.state();
            if state.icon == icon {
                return;
            }
            state.icon = icon;
        }
        let sent = async {
            let item = self.item().await?;
            Item::new_icon(item.signal_emitter()).await?;
            let iface = item.get().await;
            iface.icon_pixmap_changed(item.signal_emitter()).await
        };
        if let Err(e) = sent.await {
            tracing::debug!("tray icon change not signalled: {e}");
        }
    }

    /// Sets the menu: in place (ItemsPropertiesUpdated for the entries
    /// that changed) when it has the same shape, else as a new layout
    /// revision (LayoutUpdated).
    pub async fn set_menu(&self, menu: Vec<MenuEntry>) {
        let (change, revision, updated) = {
            let mut state = self.shared.state();
            let change = menu_change(&state.menu, &menu);
            state.menu = menu;
            if change == MenuChange::Layout {
                state.revision = state.revision.wrapping_add(1);
            }
            let updated: Vec<(i32, Props)> = match &change {
                MenuChange::Items(ids) => ids
                    .iter()
                    .filter_map(|id| Some((*id, item_props(&state.menu, *id)?)))
                    .collect(),
                _ => Vec::new(),
            };
            (change, state.revision, updated)
        };
        let sent = async {
            let emitter = SignalEmitter::new(&self.conn, MENU_PATH)?;
            match change {
                MenuChange::None => Ok(()),
                MenuChange::Layout => DbusMenu::layout_updated(&emitter, revision, 0).await,
                MenuChange::Items(_) => {
                    DbusMenu::items_properties_updated(&emitter, &updated, &[]).await
                }
            }
        };
        if let Err(e) = sent.await {
            tracing::debug!("tray menu change not signalled: {e}");
        }
    }

    async fn item(&self) -> zbus::Result<InterfaceRef<Item>> {
        self.conn.object_server().interface(ITEM_PATH).await
    }
}

/// Tells the tray host (the StatusNotifierWatcher) about the item. Sends
/// the object path, as libayatana did: the watcher takes the bus name
/// from the sender, and a bare bus name would make KDE's watcher look for
/// the item at `/StatusNotifierItem`, where there is none.
async fn register(conn: &Connection) {
    let call = conn.call_method(
        Some(WATCHER),
        WATCHER_PATH,
        Some(WATCHER),
        "RegisterStatusNotifierItem",
        &(ITEM_PATH,),
    );
    match call.await {
        Ok(_) => tracing::debug!("tray icon registered with the tray host"),
        Err(e) => tracing::debug!("no tray host to register with (yet): {e}"),
    }
}

/// NameOwnerChanged for the watcher's name: a host starting (or
/// restarting) after us forgets nothing, it never knew us.
async fn watcher_appearances(conn: &Connection) -> zbus::Result<MessageStream> {
    let rule = MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender("org.freedesktop.DBus")
        .interface("org.freedesktop.DBus")
        .member("NameOwnerChanged")
        .arg(0, WATCHER)
        .build()?;
    MessageStream::for_match_rule(rule, conn, None).await
}

/// Registers again each time the watcher's name gets a new owner; ends
/// with the connection.
async fn reregister(conn: Connection, mut hosts: MessageStream) {
    while let Some(msg) = hosts.next().await {
        let Ok(msg) = msg else { continue };
        let owner = msg.body().deserialize::<(String, String, String)>();
        if matches!(owner, Ok((_, _, new)) if !new.is_empty()) {
            register(&conn).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(id: &str, kind: EntryKind, text: &str) -> MenuEntry {
        MenuEntry {
            id: id.into(),
            kind,
            text: text.into(),
        }
    }

    fn sample_menu() -> Vec<MenuEntry> {
        vec![
            entry("call:1", EntryKind::Info, "qwen3_8b 41 tok/s"),
            entry("sep-1", EntryKind::Separator, ""),
            entry("open", EntryKind::Action, "Open speedtap"),
            entry("pause-notifications", EntryKind::Check(true), "Pause"),
        ]
    }

    /// A one-row PNG of `pixels`, 8 bits per sample.
    fn png_bytes(color: png::ColorType, width: u32, pixels: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, width, 1);
        encoder.set_color(color);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().expect("header");
        writer.write_image_data(pixels).expect("pixels");
        writer.finish().expect("finish");
        out
    }

    #[test]
    fn an_rgba_png_becomes_argb_in_network_byte_order() {
        let pixels = [10, 20, 30, 40, 50, 60, 70, 80];
        let icon = Icon::from_png(&png_bytes(png::ColorType::Rgba, 2, &pixels)).expect("icon");
        assert_eq!((icon.width, icon.height), (2, 1));
        assert_eq!(icon.argb, vec![40, 10, 20, 30, 80, 50, 60, 70]);
    }

    #[test]
    fn an_rgb_png_becomes_opaque_argb() {
        let icon = Icon::from_png(&png_bytes(png::ColorType::Rgb, 1, &[1, 2, 3])).expect("icon");
        assert_eq!(icon.argb, vec![255, 1, 2, 3]);
    }

    #[test]
    fn the_tray_icons_decode_to_one_argb_pixel_per_pixel() {
        let icon = Icon::from_png(include_bytes!("../icons/tray-idle.png")).expect("icon");
        assert_eq!((icon.width, icon.height), (32, 32));
        assert_eq!(icon.argb.len(), 32 * 32 * 4);
    }

    #[test]
    fn bytes_that_are_not_a_png_are_an_error_not_a_panic() {
        assert!(Icon::from_png(b"not a png").is_err());
    }

    #[test]
    fn the_layout_is_a_submenu_root_with_the_entries_numbered_from_one() {
        let node = layout(&sample_menu(), 0, -1, &[]).expect("root");
        assert_eq!(node.id, 0);
        assert_eq!(
            node.props.get("children-display"),
            Some(&Prop::Str("submenu".into()))
        );
        let ids: Vec<i32> = node.children.iter().map(|c| c.0.id).collect();
        assert_eq!(ids, vec![1, 2, 3, 4]);
        assert!(node.children.iter().all(|c| c.0.children.is_empty()));
    }

    #[test]
    fn entries_carry_the_properties_libdbusmenu_gave_their_gtk_items() {
        let node = layout(&sample_menu(), 0, -1, &[]).expect("root");
        let props: Vec<&Props> = node.children.iter().map(|c| &c.0.props).collect();
        let s = |v: &str| Prop::Str(v.into());
        // Underscores doubled: a single one would be a mnemonic mark.
        assert_eq!(props[0].get("label"), Some(&s("qwen3__8b 41 tok/s")));
        assert_eq!(props[0].get("enabled"), Some(&Prop::Bool(false)));
        assert_eq!(props[1].get("type"), Some(&s("separator")));
        assert_eq!(props[1].get("label"), None);
        assert_eq!(props[2].get("label"), Some(&s("Open speedtap")));
        assert_eq!(props[2].get("enabled"), Some(&Prop::Bool(true)));
        assert_eq!(props[2].get("toggle-type"), None);
        assert_eq!(props[3].get("toggle-type"), Some(&s("checkmark")));
        assert_eq!(props[3].get("toggle-state"), Some(&Prop::Int(1)));
        assert!(props
            .iter()
            .all(|p| p.get("visible") == Some(&Prop::Bool(true))));
    }

    #[test]
    fn the_layout_honours_depth_parent_and_property_names() {
        let menu = sample_menu();
        assert!(layout(&menu, 0, 0, &[]).expect("root").children.is_empty());
        let open = layout(&menu, 3, -1, &["label".into()]).expect("item 3");
        assert_eq!(open.id, 3);
        assert_eq!(
            open.props.keys().copied().collect::<Vec<_>>(),
            vec!["label"]
        );
        assert!(layout(&menu, 5, -1, &[]).is_none());
        assert!(layout(&menu, -1, -1, &[]).is_none());
    }

    #[test]
    fn the_layout_has_the_dbusmenu_signature() {
        assert_eq!(Node::SIGNATURE.to_string(), "(ia{sv}av)");
        assert_eq!(<Props as Type>::SIGNATURE.to_string(), "a{sv}");
    }

    #[test]
    fn new_texts_and_check_marks_update_items_in_place() {
        let old = sample_menu();
        assert_eq!(menu_change(&old, &old), MenuChange::None);
        let mut new = old.clone();
        new[0].text = "qwen3:8b 40 tok/s".into();
        new[3].kind = EntryKind::Check(false);
        assert_eq!(menu_change(&old, &new), MenuChange::Items(vec![1, 4]));
    }

    #[test]
    fn other_ids_kinds_or_lengths_make_a_new_layout() {
        let old = sample_menu();
        let mut other_id = old.clone();
        other_id[0].id = "call:2".into();
        let mut other_kind = old.clone();
        other_kind[2].kind = EntryKind::Info;
        let shorter = old[..3].to_vec();
        for new in [other_id, other_kind, shorter] {
            assert_eq!(menu_change(&old, &new), MenuChange::Layout);
        }
    }

    fn menu_with_clicks() -> (DbusMenu, Arc<Mutex<Vec<String>>>) {
        let clicks = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&clicks);
        let shared = Shared {
            state: Mutex::new(State {
                label: String::new(),
                icon: Icon {
                    width: 0,
                    height: 0,
                    argb: Vec::new(),
                },
                menu: sample_menu(),
                revision: 1,
            }),
            on_click: Box::new(move |id| seen.lock().expect("clicks").push(id)),
            on_activate: Box::new(|| {}),
        };
        (DbusMenu(Arc::new(shared)), clicks)
    }

    fn click(menu: &DbusMenu, id: i32) -> fdo::Result<()> {
        menu.event(id, "clicked".into(), OwnedVariant::from(0i32), 0)
    }

    #[test]
    fn a_click_reports_actions_and_checks_but_not_greyed_out_entries() {
        let (menu, clicks) = menu_with_clicks();
        for id in [0, 1, 2, 3, 4] {
            click(&menu, id).expect("known id");
        }
        let clicks = clicks.lock().expect("clicks").clone();
        assert_eq!(clicks, vec!["open", "pause-notifications"]);
    }

    #[test]
    fn a_click_on_an_id_the_layout_lacks_is_refused() {
        let (menu, _) = menu_with_clicks();
        for id in [5, -3] {
            let err = click(&menu, id).expect_err("unknown id");
            assert!(err.to_string().contains(NOT_AN_ITEM), "{err}");
        }
        let unknown = menu.event_group(vec![
            (3, "clicked".into(), OwnedVariant::from(0i32), 0),
            (9, "clicked".into(), OwnedVariant::from(0i32), 0),
        ]);
        assert_eq!(unknown, vec![9]);
    }

    /// `busctl --user --json=short -- ARGS`, as the desktop tests read the
    /// tray: the JSON reply, or busctl's error message.
    fn busctl(args: &[&str]) -> Result<serde_json::Value, String> {
        let out = std::process::Command::new("busctl")
            .args(["--user", "--json=short", "--"])
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        if text.trim().is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| e.to_string())
    }

    /// [`busctl`] off the runtime's threads, which serve the tray.
    async fn bus(args: &[&str]) -> Result<serde_json::Value, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            busctl(&args)
        })
        .await
        .expect("busctl task")
    }

    async fn label(name: &str) -> serde_json::Value {
        let args = [
            "get-property",
            name,
            ITEM_PATH,
            "org.kde.StatusNotifierItem",
        ];
        let reply = bus(&[&args[..], &["XAyatanaLabel"]].concat()).await;
        reply.expect("XAyatanaLabel")["data"].clone()
    }

    /// (revision, labels of the root's children) from GetLayout.
    async fn menu_labels(name: &str) -> (u64, Vec<String>) {
        let args = [
            "call",
            name,
            MENU_PATH,
            "com.canonical.dbusmenu",
            "GetLayout",
            "iias",
            "0",
            "-1",
            "0",
        ];
        let reply = bus(&args).await.expect("GetLayout");
        let revision = reply["data"][0].as_u64().expect("revision");
        let children = reply["data"][1][2].as_array().expect("children").clone();
        let labels = children
            .iter()
            .map(|c| {
                c["data"][1]["label"]["data"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect();
        (revision, labels)
    }

    async fn click_on_bus(name: &str, id: &str) -> Result<serde_json::Value, String> {
        let args = ["call", name, MENU_PATH, "com.canonical.dbusmenu", "Event"];
        bus(&[&args[..], &["isvu", id, "clicked", "s", "", "0"]].concat()).await
    }

    /// Every XAyatanaNewLabel the item sends.
    async fn new_labels() -> MessageStream {
        let client = Connection::session().await.expect("client connection");
        let rule = MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface("org.kde.StatusNotifierItem")
            .member("XAyatanaNewLabel")
            .build()
            .expect("rule");
        MessageStream::for_match_rule(rule, &client, None)
            .await
            .expect("signal stream")
    }

    /// A StatusNotifierWatcher that reports who registered what.
    struct FakeWatcher(tokio::sync::mpsc::UnboundedSender<(String, String)>);

    #[interface(name = "org.kde.StatusNotifierWatcher")]
    impl FakeWatcher {
        fn register_status_notifier_item(
            &self,
            service: String,
            #[zbus(header)] header: zbus::message::Header<'_>,
        ) {
            let sender = header.sender().map(|s| s.to_string()).unwrap_or_default();
            let _ = self.0.send((service, sender));
        }
    }

    async fn within_5_s<T>(what: &str, next: impl std::future::Future<Output = Option<T>>) -> T {
        let got = tokio::time::timeout(Duration::from_secs(5), next).await;
        got.unwrap_or_else(|_| panic!("no {what} within 5 s"))
            .unwrap_or_else(|| panic!("{what}: channel closed"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_session_bus_the_tray_shows_its_label_and_menu_and_takes_clicks() {
        if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_none() {
            eprintln!("skipped: no session bus (run under `dbus-run-session --`)");
            return;
        }
        let icon = Icon::from_png(include_bytes!("../icons/tray-idle.png")).expect("icon");
        let (click_tx, mut clicks) = tokio::sync::mpsc::unbounded_channel();
        let (activate_tx, mut activations) = tokio::sync::mpsc::unbounded_channel();
        let on_click = move |id| {
            let _ = click_tx.send(id);
        };
        let on_activate = move || {
            let _ = activate_tx.send(());
        };
        let tray = Tray::start("idle", icon, sample_menu(), on_click, on_activate)
            .await
            .expect("tray on the bus");
        let name = format!("org.kde.StatusNotifierItem-{}-1", std::process::id());

        assert_eq!(label(&name).await, "idle");
        click_on_bus(&name, "3").await.expect("click on Open");
        assert_eq!(within_5_s("click", clicks.recv()).await, "open");
        let refused = click_on_bus(&name, "9").await.expect_err("no item 9");
        assert!(refused.contains(NOT_AN_ITEM), "{refused}");
        let activate = ["call", &name, ITEM_PATH, "org.kde.StatusNotifierItem"];
        bus(&[&activate[..], &["Activate", "ii", "0", "0"]].concat())
            .await
            .expect("Activate");
        within_5_s("activation", activations.recv()).await;

        a_new_label_is_signalled_and_shown(&tray, &name).await;
        menu_changes_keep_or_bump_the_revision(&tray, &name).await;
        a_watcher_that_appears_later_gets_the_item(&tray).await;
    }

    async fn a_new_label_is_signalled_and_shown(tray: &Tray, name: &str) {
        let mut signals = new_labels().await;
        tray.set_label("41.7 tok/s").await;
        let signal = within_5_s("XAyatanaNewLabel", signals.next()).await;
        let args: (String, String) = signal.expect("message").body().deserialize().expect("ss");
        assert_eq!(args, ("41.7 tok/s".to_owned(), String::new()));
        assert_eq!(label(name).await, "41.7 tok/s");
    }

    async fn menu_changes_keep_or_bump_the_revision(tray: &Tray, name: &str) {
        let (revision, labels) = menu_labels(name).await;
        assert_eq!(labels, ["qwen3__8b 41 tok/s", "", "Open speedtap", "Pause"]);
        // Same shape: same revision, new text. Another shape: a new revision.
        let mut menu = sample_menu();
        menu[2].text = "Open the window".into();
        tray.set_menu(menu.clone()).await;
        assert_eq!(menu_labels(name).await, (revision, labels_of(&menu)));
        menu.remove(0);
        tray.set_menu(menu.clone()).await;
        assert_eq!(menu_labels(name).await, (revision + 1, labels_of(&menu)));
    }

    /// Registered by its object path, from the tray's own connection.
    async fn a_watcher_that_appears_later_gets_the_item(tray: &Tray) {
        let (tx, mut registered) = tokio::sync::mpsc::unbounded_channel();
        let _watcher = zbus::connection::Builder::session()
            .name(WATCHER)
            .serve_at(WATCHER_PATH, FakeWatcher(tx))
            .build()
            .await
            .expect("a watcher on the bus");
        let (service, sender) = within_5_s("registration", registered.recv()).await;
        assert_eq!(service, ITEM_PATH);
        let unique = tray.conn.unique_name().expect("unique name");
        assert_eq!(sender, unique.as_str());
    }

    fn labels_of(menu: &[MenuEntry]) -> Vec<String> {
        menu.iter()
            .map(|e| match e.kind {
                EntryKind::Separator => String::new(),
                _ => e.text.replace('_', "__"),
            })
            .collect()
    }
}
