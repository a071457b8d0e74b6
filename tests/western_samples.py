"""Short Western European texts (written for these tests), to check that their cp1252 / Latin-1 bytes
are read back as written."""

from __future__ import annotations

FRENCH = [
    "Très bien, à demain.",
    "Le café est prêt, nous partons à midi.",
    "Noël approche : les enfants décorent le sapin.",
    "Où est la gare ? Elle est à côté de l'hôtel.",
    "Il a reçu une lettre très émouvante.",
    "Le garçon mange une crème brûlée.",
    "Nous irons à la plage l'été prochain, si le temps le permet.",
    "Ça coûte trop cher pour un élève.",
    "La fenêtre donne sur un jardin fleuri où chantent les oiseaux.",
    "Les élèves ont révisé leur leçon de géographie avant l'examen.",
    "Hélène préfère le thé à la menthe.",
    "Un cœur léger fait la journée plus douce.",
    "Le maître d'école a félicité toute la classe.",
    "Il fait déjà nuit à dix-sept heures en décembre.",
    "Après la réunion, nous avons dîné au restaurant près du théâtre.",
    "Ce n'est pas grave, ça arrive à tout le monde.",
    "L'été dernier, nous avons visité la Bretagne et la Normandie.",
]
GERMAN = [
    "Der Bär schläft im Wald.",
    "Die Möwe fliegt über den großen See nach Köln.",
    "Grüß Gott, wie geht's?",
    "Wir müssen früh aufstehen, um den Zug zu erreichen.",
    "Das Mädchen öffnet die Tür und lächelt.",
    "Im Frühling blühen die Blumen auf der Wiese.",
    "Ich hätte gern ein Stück Käsekuchen.",
    "Die Straße ist nach dem Regen sehr nass.",
    "Für die Prüfung lernt er jeden Abend zwei Stunden.",
    "Der Schlüssel liegt auf dem Küchentisch.",
    "Übermorgen fahren wir in die Schweiz.",
    "Die Bäckerei öffnet um sechs Uhr früh.",
    "Sie trägt einen weißen Hut und grüne Schuhe.",
    "Es ist schön, dich wiederzusehen.",
    "Der Fußball rollte über den Rasen ins Tor.",
    "Mein Großvater erzählt gern Geschichten aus seiner Jugend.",
]
SPANISH = [
    "¿Dónde está la estación?",
    "El niño comió una manzana en el jardín.",
    "¡Qué día tan bonito para pasear por la montaña!",
    "Mañana iremos al médico a las diez.",
    "La canción más famosa del año sonó en la radio.",
    "Él compró un regalo para su compañero de oficina.",
    "Nuestro vecino tiene un pequeño perro marrón.",
    "El próximo miércoles habrá una reunión importante.",
    "Ella leyó el periódico mientras tomaba café.",
    "Los pingüinos viven en lugares muy fríos.",
    "¿Cuántos años tienes? Tengo veintiún años.",
    "La lección de música empieza después del almuerzo.",
    "En invierno la ciudad se llena de turistas extranjeros.",
    "El camión llegó tarde por la niebla de la mañana.",
    "¡Feliz cumpleaños, mi querida abuela!",
    "Según el informe, la situación económica mejoró.",
    "Aquí se habla español y también inglés.",
]
SAMPLES = FRENCH + GERMAN + SPANISH
